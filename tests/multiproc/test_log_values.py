"""accelerator.log of tensors: the kernel gets the same numbers as for floats, and the training
thread never reads a logged tensor (reading a GPU tensor would make it wait for the GPU)."""

from __future__ import annotations

import threading
from typing import Any, ClassVar

import torch

import nb_accel
from nb_accel._messages import Report
from nb_accel.launch.views.view import NullView, register_view_factory, view_factory


class Recorder(NullView):
    """A launch view that keeps every report."""

    def __init__(self) -> None:
        self.reports: list[Report] = []

    def report(self, event: Report) -> None:
        """Keep it."""
        self.reports.append(event)


class Watched(torch.Tensor):
    """A tensor that notes the thread of every ``item()`` (the call that reads a GPU tensor)."""

    readers: ClassVar[list[str]] = []

    def item(self) -> Any:
        """Note the thread, then read."""
        Watched.readers.append(threading.current_thread().name)
        return super().item()


def log_tensors_and_floats() -> list[str]:
    """Log each value as a float and as tensors; return the threads that read a tensor while
    the loop ran."""
    accelerator = nb_accel.Accelerator()
    running = torch.zeros((), dtype=torch.float64).as_subclass(Watched)
    for i in range(40):
        value = 1.0 / (i + 3)
        loss = torch.tensor(value, dtype=torch.float64, requires_grad=True)
        loss = loss.as_subclass(Watched) * 1.0
        running += value
        accelerator.log(
            {"float": value, "tensor": loss, "running": running, "int": torch.tensor(i)},
            step=i,
        )
        running.mul_(0.0)  # changed after logging: the logged value must not change
    return [name for name in Watched.readers if name == threading.current_thread().name]


def test_logged_tensors_arrive_as_the_same_numbers_without_a_read_on_the_training_thread() -> None:
    recorder = Recorder()
    previous = view_factory()
    register_view_factory(lambda title, world_size, all_ranks: recorder)
    try:
        results = nb_accel.notebook_launcher(log_tensors_and_floats, num_processes=2)
    finally:
        register_view_factory(previous)
    assert results == [[], []]  # no item() on the training thread
    for rank in (0, 1):
        points = [p for r in recorder.reports if r.rank == rank for p in r.metrics]
        assert [step for step, _ in points] == list(range(40))
        for step, values in points:
            assert values["tensor"] == values["float"] == values["running"], (step, values)
            assert values["int"] == float(step)
