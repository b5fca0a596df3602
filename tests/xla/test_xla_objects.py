"""Object collectives on XLA: right values, and a few compiled graphs for any number of sizes."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch_xla")

from nb_accel import Accelerator, notebook_launcher
from nb_accel.utils import broadcast_object_list, gather_object


def _compilations() -> int:
    import torch_xla.debug.metrics as met

    data = met.metric_data("CompileTime")
    return int(data[0]) if data else 0


def exchange_many_sizes(lengths: list[int]) -> dict[str, Any]:
    accelerator = Accelerator()
    accelerator.wait_for_everyone()
    gather_object(["warm-up"])
    broadcast_object_list(["warm-up"])
    before = _compilations()
    gathered, broadcast = [], []
    for length in lengths:
        gathered.append(gather_object(["x" * length]))
        broadcast.append(broadcast_object_list([{"n": length, "text": "y" * length}, None])[0])
        accelerator.wait_for_everyone()
    return {
        "compilations": _compilations() - before,
        "gathered": gathered,
        "broadcast": broadcast,
    }


def test_gather_and_broadcast_objects_of_many_sizes_compile_a_few_graphs() -> None:
    # 40 payload sizes between a few bytes and 3 KiB: rows of 1, 2 and 4 KiB
    lengths = [3 + 79 * k for k in range(40)]
    result = notebook_launcher(exchange_many_sizes, args=(lengths,), show_progress=False)[0]
    assert result["gathered"] == [["x" * n] for n in lengths]
    assert result["broadcast"] == [{"n": n, "text": "y" * n} for n in lengths]
    # the two widths not warmed up yet (2 and 4 KiB), not one graph per size
    assert result["compilations"] <= 2, result["compilations"]
