"""``accelerator.profile()`` with ``ProfileKwargs``: torch's profiler on every process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from nb_accel import Accelerator, notebook_launcher
from nb_accel.utils import ProfileKwargs


def profile_with_trace_files(folder: str) -> dict[str, Any]:
    handler = ProfileKwargs(activities=["cpu"], record_shapes=True, output_trace_dir=folder)
    accelerator = Accelerator(cpu=True, kwargs_handlers=[handler])
    size = 5 + accelerator.process_index
    with accelerator.profile() as prof:
        torch.mm(torch.ones(size, 3), torch.ones(3, 7))
    shapes = [event.input_shapes for event in prof.key_averages(group_by_input_shape=True)]
    names = {event.key for event in prof.key_averages()}
    own_file = Path(folder, f"profile_{accelerator.process_index}.json")
    # Both files exist here: profile() waits for every process after writing its own.
    return {
        "mm": "aten::mm" in names,
        "shape_recorded": [[size, 3], [3, 7]] in shapes,
        "own_file": own_file.is_file(),
        "both_files": sorted(p.name for p in Path(folder).iterdir()),
        "handler": accelerator.profile_handler is handler,
    }


@pytest.mark.timeout(180)
def test_profile_records_operators_and_writes_a_trace_per_process(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    results = notebook_launcher(profile_with_trace_files, args=(str(folder),), num_processes=2)
    for result in results:
        assert result == {
            "mm": True,
            "shape_recorded": True,
            "own_file": True,
            "both_files": ["profile_0.json", "profile_1.json"],
            "handler": True,
        }
    for rank in (0, 1):
        trace = json.loads((folder / f"profile_{rank}.json").read_text())
        assert any(event.get("name") == "aten::mm" for event in trace["traceEvents"])


def profile_on_a_schedule() -> dict[str, Any]:
    accelerator = Accelerator(cpu=True)
    ready: list[int] = []

    def on_ready(prof: Any) -> None:
        ready.append(sum(e.count for e in prof.key_averages() if e.key == "aten::mm"))

    handler = ProfileKwargs(
        schedule_option={"wait": 1, "warmup": 1, "active": 2, "repeat": 1},
        on_trace_ready=on_ready,
    )
    with accelerator.profile(handler) as prof:
        for _ in range(8):
            torch.mm(torch.ones(4, 4), torch.ones(4, 4))
            prof.step()
    return {"ready": ready, "default_handler": accelerator.profile_handler}


@pytest.mark.timeout(180)
def test_a_handler_passed_to_profile_brings_its_schedule() -> None:
    for result in notebook_launcher(profile_on_a_schedule, num_processes=2):
        # Recorded once (repeat=1), over the two active steps only.
        assert result == {"ready": [2], "default_handler": None}


def test_an_unknown_activity_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown profiler activity 'tpu'"):
        ProfileKwargs(activities=["tpu"]).build()
