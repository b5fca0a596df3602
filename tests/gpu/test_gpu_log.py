"""accelerator.log of CUDA tensors (skipped without CUDA): the training thread never reads them,
and values computed on a side stream arrive as computed."""

from __future__ import annotations

import threading
from typing import Any, ClassVar

import pytest
import torch

import nb_accel
from nb_accel._messages import Report
from nb_accel.launch.views.view import NullView, register_view_factory, view_factory
from nb_accel.runtime.device_types import cuda_facts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(cuda_facts.cuda_device_count() == 0, reason="needs a CUDA GPU"),
]


class Recorder(NullView):
    """A launch view that keeps every report."""

    def __init__(self) -> None:
        self.reports: list[Report] = []

    def report(self, event: Report) -> None:
        """Keep it."""
        self.reports.append(event)


class Watched(torch.Tensor):
    """A tensor that notes the thread of every ``item()`` (which waits for the GPU)."""

    readers: ClassVar[list[str]] = []

    def item(self) -> Any:
        """Note the thread, then read."""
        Watched.readers.append(threading.current_thread().name)
        return super().item()


def log_cuda_tensors() -> list[str]:
    accelerator = nb_accel.Accelerator()
    side = torch.cuda.Stream(accelerator.device)
    for i in range(20):
        value = float(i) + 0.5
        on_default = torch.tensor(value, device=accelerator.device).as_subclass(Watched)
        with torch.cuda.stream(side):
            torch.cuda._sleep(20_000_000)  # the side stream is busy: the value comes late
            on_side = torch.full((), value, device=accelerator.device)
            accelerator.log({"float": value, "default": on_default, "side": on_side}, step=i)
    return [name for name in Watched.readers if name == threading.current_thread().name]


def test_logged_cuda_tensors_are_read_off_the_training_thread_with_their_values() -> None:
    recorder = Recorder()
    previous = view_factory()
    register_view_factory(lambda title, world_size, all_ranks: recorder)
    try:
        [training_thread_reads] = nb_accel.notebook_launcher(log_cuda_tensors, num_processes=1)
    finally:
        register_view_factory(previous)
    assert training_thread_reads == []
    points = [p for r in recorder.reports for p in r.metrics]
    assert [step for step, _ in points] == list(range(20))
    for _, values in points:
        assert values["default"] == values["side"] == values["float"]
    assert not torch.cuda.is_initialized()  # the launcher never touched CUDA in this process
