"""An XLA launch's workers set what 🤗 Accelerate reads, whatever the kernel's environment says,
and their plain tqdm bars are rows of the launch view as on every other launch."""

from __future__ import annotations

import importlib.util
import os

import pytest

pytest.importorskip("torch_xla")

import tqdm

from nb_accel import notebook_launcher
from nb_accel._messages import Report
from nb_accel.launch.views.view import NullView, register_view_factory, view_factory

pytestmark = pytest.mark.timeout(180)

#: What the workers must set (the kernel says otherwise in the tests below).
NAMES = ("ACCELERATE_USE_CPU", "ACCELERATE_MIXED_PRECISION", "ACCELERATE_USE_FSDP")


class Recorder(NullView):
    """A launch view that keeps every report."""

    def __init__(self) -> None:
        self.reports: list[Report] = []

    def report(self, event: Report) -> None:
        """Keep it."""
        self.reports.append(event)


def accelerate_variables() -> dict[str, str | None]:
    for _ in tqdm.tqdm(range(5), desc="plain bar"):
        pass
    return {name: os.environ.get(name) for name in NAMES}


def test_xla_workers_set_accelerate_s_variables_and_report_plain_bars(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    recorder = Recorder()
    previous = view_factory()
    register_view_factory(lambda title, world_size, all_ranks: recorder)
    try:
        (variables,) = notebook_launcher(accelerate_variables, num_processes=1)
    finally:
        register_view_factory(previous)
    assert variables == {
        "ACCELERATE_USE_CPU": "false",
        "ACCELERATE_MIXED_PRECISION": "no",
        "ACCELERATE_USE_FSDP": "false",
    }
    bars = [bar for report in recorder.reports for bar in report.bars if bar.closed]
    assert [(bar.desc, bar.n) for bar in bars] == [("plain bar", 5)]


def accelerate_s_own_state() -> tuple[str, int, str]:
    import accelerate

    accelerator = accelerate.Accelerator()
    return (
        accelerator.distributed_type.value,
        accelerator.num_processes,
        accelerator.device.type,
    )


@pytest.mark.skipif(importlib.util.find_spec("accelerate") is None, reason="needs accelerate")
def test_accelerate_s_own_accelerator_runs_on_the_xla_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")  # the kernel's, left from an experiment
    (state,) = notebook_launcher(accelerate_s_own_state, num_processes=1)
    assert state == ("XLA", 1, "xla")
