"""Several ranks in one process, one thread each, as torch_xla runs a TPU v2/v3 chip's two
TensorCores: here the CPU device with ``CPU_NUM_DEVICES=2`` (one process, two rank threads)."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

pytest.importorskip("torch_xla")

from nb_accel import Accelerator, notebook_launcher, tqdm
from nb_accel._messages import Report
from nb_accel.launch.views.view import NullView, register_view_factory, view_factory

#: Inherited by the forked worker: both rank threads of its process wait here, so each
#: runs while the other is alive.
BOTH_RANKS = threading.Barrier(2)


class RankOneError(RuntimeError):
    """Raised by rank 1 only."""


@pytest.fixture(autouse=True)
def two_devices_in_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CPU_NUM_DEVICES", "2")
    BOTH_RANKS.reset()


def who_am_i() -> dict[str, Any]:
    accelerator = Accelerator()
    BOTH_RANKS.wait(timeout=60)
    print(f"line from rank {accelerator.process_index}")
    BOTH_RANKS.wait(timeout=60)
    return {
        "rank": accelerator.process_index,
        "world": accelerator.num_processes,
        "local": (accelerator.local_process_index, accelerator.state.num_local_processes),
        "device": str(accelerator.device),
        "pid": os.getpid(),
        "thread": threading.get_ident(),
        "RANK": os.environ.get("RANK"),
        "WORLD_SIZE": os.environ.get("WORLD_SIZE"),
    }


def test_two_ranks_run_as_threads_of_one_process_with_states_of_their_own(
    capsys: pytest.CaptureFixture[str],
) -> None:
    results = notebook_launcher(who_am_i, show_progress=False)
    assert [r["rank"] for r in results] == [0, 1]
    assert {r["world"] for r in results} == {2}
    assert [r["local"] for r in results] == [(0, 2), (1, 2)]
    assert [r["device"] for r in results] == ["xla:0", "xla:1"]
    assert results[0]["pid"] == results[1]["pid"] != os.getpid()
    assert results[0]["thread"] != results[1]["thread"]
    # RANK would name one of the two: the environment names the world only
    assert [(r["RANK"], r["WORLD_SIZE"]) for r in results] == [(None, "2"), (None, "2")]
    out = capsys.readouterr().out
    assert "[rank 0] line from rank 0" in out
    assert "[rank 1] line from rank 1" in out


def fail_on_rank_one() -> int:
    accelerator = Accelerator()
    if accelerator.process_index == 1:
        raise RankOneError("rank one gave up")
    return accelerator.process_index


def test_a_failing_rank_thread_is_raised_with_its_rank() -> None:
    with pytest.raises(RankOneError, match="rank one gave up") as caught:
        notebook_launcher(fail_on_rank_one, show_progress=False)
    assert any("rank 1" in note for note in getattr(caught.value, "__notes__", []))


class Recorder(NullView):
    """A launch view that keeps every report."""

    def __init__(self) -> None:
        self.reports: list[Report] = []

    def report(self, event: Report) -> None:
        """Keep it."""
        self.reports.append(event)


def log_my_rank() -> int:
    accelerator = Accelerator()
    BOTH_RANKS.wait(timeout=60)
    for step in tqdm(range(3), desc=f"rank {accelerator.process_index}'s bar"):
        accelerator.log({"who": float(accelerator.process_index)}, step=step)
    BOTH_RANKS.wait(timeout=60)
    return accelerator.process_index


def test_each_rank_thread_reports_its_own_progress_and_metrics() -> None:
    recorder = Recorder()
    previous = view_factory()
    register_view_factory(lambda title, world_size, all_ranks: recorder)
    try:
        assert notebook_launcher(log_my_rank) == [0, 1]
    finally:
        register_view_factory(previous)
    for rank in (0, 1):
        mine = [report for report in recorder.reports if report.rank == rank]
        points = [point for report in mine for point in report.metrics]
        assert points == [(step, {"who": float(rank)}) for step in range(3)]
        bars = {bar.desc for report in mine for bar in report.bars}
        assert bars == {f"rank {rank}'s bar"}
