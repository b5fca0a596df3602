"""Ranks, processes and threads of an XLA launch, from the facts torch_xla gives.

On the CPU device, ``CPU_NUM_DEVICES=2`` gives one process that sees two devices, the shape of a
TPU v2/v3 process (one chip, two TensorCores); the TPU facts are read through torch_xla's own
functions, answered by the test.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

pytest.importorskip("torch_xla")

import torch_xla.runtime as xr
from torch_xla._internal import tpu

from nb_accel import Accelerator, notebook_launcher
from nb_accel.runtime.xla.tpu_plan import XlaFacts, read_xla_facts


def describe() -> dict[str, Any]:
    accelerator = Accelerator()
    return {
        "rank": accelerator.process_index,
        "world": accelerator.num_processes,
        "device": str(accelerator.device),
        "pid": os.getpid(),
    }


def test_cpu_devices_are_read_as_threads_of_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CPU_NUM_DEVICES", "2")
    assert read_xla_facts() == XlaFacts("CPU", processes=1, devices_per_process=2)


def test_one_rank_on_a_process_that_sees_two_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    # what num_processes=1 does on a TPU v2/v3: one process, its chip's two cores, one used
    monkeypatch.setenv("CPU_NUM_DEVICES", "2")
    results = notebook_launcher(describe, num_processes=1, show_progress=False)
    assert len(results) == 1
    assert (results[0]["rank"], results[0]["world"]) == (0, 1)
    assert results[0]["device"].startswith("xla")


def test_an_impossible_count_names_the_counts_that_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CPU_NUM_DEVICES", "2")
    with pytest.raises(ValueError, match="num_processes=3") as caught:
        notebook_launcher(describe, num_processes=3, show_progress=False)
    assert "num_processes=2" in str(caught.value)
    assert "num_processes=1" in str(caught.value)


@pytest.fixture
def tpu_v3_8(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch_xla's answers on a TPU v3-8 host: 4 chips, generation 3 from the metadata."""
    monkeypatch.delenv("TPU_ACCELERATOR_TYPE", raising=False)
    monkeypatch.setattr(xr, "device_type", lambda: "TPU")
    monkeypatch.setattr(tpu, "num_local_processes", lambda: 4)
    monkeypatch.setattr(tpu, "version", lambda: 3)


@pytest.mark.usefixtures("tpu_v3_8")
def test_a_tpu_v3_host_is_read_as_four_processes_of_two_ranks() -> None:
    assert read_xla_facts() == XlaFacts("TPU", 4, devices_per_process=2, accelerator="v3")


@pytest.mark.usefixtures("tpu_v3_8")
def test_the_accelerator_type_decides_the_generation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-8")
    monkeypatch.setattr(tpu, "num_local_processes", lambda: 8)
    assert read_xla_facts() == XlaFacts("TPU", 8, devices_per_process=1, accelerator="v5litepod-8")


@pytest.mark.usefixtures("tpu_v3_8")
def test_four_processes_on_a_tpu_v3_8_are_refused_before_anything_starts() -> None:
    with pytest.raises(ValueError, match="num_processes=4") as caught:
        notebook_launcher(describe, num_processes=4, show_progress=False)
    message = str(caught.value)
    assert "TPU v3" in message and "num_processes=8" in message
    assert "4 chips with 2 TensorCores each" in message


def test_a_tpu_of_unknown_generation_says_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TPU_ACCELERATOR_TYPE", raising=False)
    monkeypatch.setattr(xr, "device_type", lambda: "TPU")
    monkeypatch.setattr(tpu, "num_local_processes", lambda: 4)

    def no_metadata() -> int:
        raise OSError("Failed to get TPU metadata")

    monkeypatch.setattr(tpu, "version", no_metadata)
    with pytest.raises(ValueError, match="TPU_ACCELERATOR_TYPE"):
        notebook_launcher(describe, show_progress=False)
