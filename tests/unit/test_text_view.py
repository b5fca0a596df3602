"""The text view: ranks named by their global number (also on a later node of a multi-node
launch), failed, stopped and stalled ranks."""

from __future__ import annotations

import io

import pytest

from nb_accel._messages import BarState, Report
from nb_accel.launch.views.stall import (
    STALL_AFTER_ENV,
    STALL_AFTER_S,
    note_prompt_time,
    stall_after_s,
)
from nb_accel.launch.views.text_view import TextView


def test_failures_name_the_global_rank_on_a_later_node() -> None:
    stream = io.StringIO()
    view = TextView(2, stream=stream, first_rank=2)
    view.failed(1, "ValueError: bad batch")
    assert "rank 3 failed: ValueError: bad batch" in stream.getvalue()


def test_on_one_node_ranks_are_counted_from_zero() -> None:
    stream = io.StringIO()
    view = TextView(2, stream=stream)
    view.failed(1, "ValueError: bad batch")
    assert "rank 1 failed: ValueError: bad batch" in stream.getvalue()


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


def bar(n: float, elapsed: float = 1.0, closed: bool = False) -> BarState:
    return BarState(
        bar=0, level=0, desc="train", n=n, total=100, unit="it", elapsed=elapsed,
        rate=None, postfix="", closed=closed, leave=True,
    )  # fmt: skip


def report(rank: int, *bars: BarState) -> Report:
    return Report(rank=rank, bars=bars, metrics=(), time=0.0)


def launch(world_size: int = 2) -> tuple[TextView, Clock, io.StringIO]:
    clock, stream = Clock(), io.StringIO()
    view = TextView(world_size, stream=stream, clock=clock, stall_after_s=30.0)
    for rank in range(world_size):
        view.started(rank, 100 + rank)
    return view, clock, stream


def stall_lines(stream: io.StringIO) -> list[str]:
    return [line for line in stream.getvalue().splitlines() if "progress" in line]


def test_a_rank_whose_bar_only_redraws_is_reported_stalled_and_a_finished_one_is_not() -> None:
    view, clock, stream = launch()
    view.report(report(1, bar(2)))
    view.report(report(0, bar(100, closed=True)))
    view.returned(0)
    for second in range(1, 41):  # rank 1's bar redraws every 10 s, its count stuck at 2
        clock.now += 1
        if second % 10 == 0:
            view.report(report(1, bar(2, elapsed=second)))
        view.tick()
    assert stall_lines(stream) == ["rank 1 has made no progress for 30 s"]
    view.report(report(1, bar(3, elapsed=41)))
    assert stall_lines(stream)[-1] == "rank 1 is making progress again"
    clock.now += 31
    view.tick()
    assert stall_lines(stream)[-1] == "rank 1 has made no progress for 31 s"
    view.finished(True)
    assert len(stall_lines(stream)) == 3


def test_a_rank_that_never_reported_is_stalled_once_another_makes_progress() -> None:
    view, clock, stream = launch(3)
    clock.now += 100
    view.tick()
    assert stall_lines(stream) == []  # a function that shows no progress is not stalled
    view.report(report(0, bar(1)))
    view.report(report(2, bar(1)))
    view.returned(0)
    view.failed(2, "ValueError: bad batch")
    clock.now += 1
    view.tick()
    assert stall_lines(stream) == ["rank 1 has made no progress for 101 s"]


def test_time_spent_at_a_ranks_prompt_is_not_a_stall() -> None:
    view, clock, stream = launch(2)
    view.report(report(0, bar(1)))
    view.report(report(1, bar(1)))
    clock.now += 25  # then a rank's debugger waits 100 s for the user
    note_prompt_time(100.0)
    clock.now += 100
    view.tick()
    assert stall_lines(stream) == []  # 25 s of its own: not stalled
    clock.now += 6
    view.tick()
    assert stall_lines(stream) == [f"rank {r} has made no progress for 31 s" for r in (0, 1)]


def test_stopped_ranks_get_a_line_with_the_reason_and_are_never_stalled() -> None:
    view, clock, stream = launch(3)
    view.report(report(0, bar(5)))
    view.failed(1, "ValueError: bad batch")
    view.stopped(2, "rank 1 failed")
    clock.now += 60
    view.tick()
    lines = stream.getvalue().splitlines()
    assert "rank 1 failed: ValueError: bad batch" in lines
    assert "rank 2 stopped (rank 1 failed)" in lines
    assert stall_lines(stream) == ["rank 0 has made no progress for 60 s"]


def test_the_threshold_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(STALL_AFTER_ENV, "2.5")
    assert stall_after_s() == 2.5
    clock, stream = Clock(), io.StringIO()
    view = TextView(2, stream=stream, clock=clock)
    view.report(report(0, bar(1)))
    clock.now += 2
    view.tick()
    assert stall_lines(stream) == []
    view.report(report(0, bar(2)))
    clock.now += 1
    view.tick()
    assert stall_lines(stream) == ["rank 1 has made no progress for 3 s"]
    for wrong in ("", "soon", "-1", "nan", "inf"):
        monkeypatch.setenv(STALL_AFTER_ENV, wrong)
        assert stall_after_s() == STALL_AFTER_S


def test_lines_name_the_host_of_a_rank_in_a_launch_across_hosts() -> None:
    stream = io.StringIO()
    view = TextView(4, stream=stream, hosts=["node0", "node0", "node1", "node1"])
    view.failed(3, "KeyError: 'x'")
    view.stopped(1, "rank 3 failed")
    assert "rank 3 (node1) failed: KeyError: 'x'" in stream.getvalue()
    assert "rank 1 (node0) stopped (rank 3 failed)" in stream.getvalue()


def test_a_restart_is_a_line_of_its_own() -> None:
    stream = io.StringIO()
    view = TextView(2, stream=stream)
    view.failed(1, "worker for rank 1 (pid 101) was killed by SIGKILL")
    view.restarted("restart 1 of 2 after rank 1 was killed by SIGKILL")
    lines = stream.getvalue().splitlines()
    assert lines[-2:] == [
        "rank 1 failed: worker for rank 1 (pid 101) was killed by SIGKILL",
        "restart 1 of 2 after rank 1 was killed by SIGKILL",
    ]
