"""The rank's own collective deadline: how long it has waited in one collective, the time the
kernel spent at prompts left out; a new collective starts the count again; the prompt clock's
file as the kernel writes it and the ranks read it."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from nb_accel.worker.debugging.deadline import CollectiveDeadline
from nb_accel.worker.debugging.prompt_clock import prompt_open, prompt_seconds, write_prompt_clock
from nb_accel.worker.reporting.collective_trail import LastCollective

ALL_REDUCE = LastCollective(op="all_reduce", sequence=2, backend="gloo")


class Pending:
    """What the flight recorder says is in flight, as the test sets it."""

    def __init__(self) -> None:
        self.now: tuple[int, LastCollective] | None = None

    def __call__(self) -> tuple[int, LastCollective] | None:
        return self.now


def _deadline(tmp_path: Path, timeout_s: float) -> tuple[CollectiveDeadline, Pending, str]:
    pending, clock = Pending(), str(tmp_path / "prompt-clock")
    return CollectiveDeadline(timeout_s, clock, lambda *_: None, pending), pending, clock


def test_a_collective_is_overdue_once_it_waited_the_timeout(tmp_path: Path) -> None:
    deadline, pending, _ = _deadline(tmp_path, 2.0)
    assert deadline.overdue(0.0) is None  # nothing in flight
    pending.now = (7, ALL_REDUCE)
    assert deadline.overdue(10.0) is None  # first seen
    assert deadline.overdue(11.9) is None
    assert deadline.overdue(12.0) == ALL_REDUCE
    pending.now = (8, ALL_REDUCE)  # the next collective: counted afresh
    assert deadline.overdue(12.5) is None
    assert deadline.overdue(13.0) is None
    pending.now = None
    assert deadline.overdue(20.0) is None


def test_a_collective_is_found_overdue_once(tmp_path: Path) -> None:
    """A pool's rank acts once on a collective past its deadline (its entry may stay in the
    recorder after the group was aborted)."""
    deadline, pending, _ = _deadline(tmp_path, 1.0)
    pending.now = (3, ALL_REDUCE)
    assert deadline.overdue(0.0) is None
    assert deadline.overdue(1.0) == ALL_REDUCE
    assert deadline.overdue(5.0) is None
    pending.now = (4, ALL_REDUCE)
    assert deadline.overdue(6.0) is None
    assert deadline.overdue(7.0) == ALL_REDUCE


def test_collectives_entered_before_a_command_ended_are_forgotten(tmp_path: Path) -> None:
    """A pool's command ended (freed by a peer's error): what it entered is never acted on,
    even while its entry has not retired yet; what comes later is timed as usual."""
    deadline, pending, _ = _deadline(tmp_path, 1.0)
    entered = dataclasses.replace(ALL_REDUCE, created_ns=time.time_ns())
    pending.now = (5, entered)
    assert deadline.overdue(0.0) is None
    deadline.forget_in_flight()
    assert deadline.overdue(0.5) is None
    assert deadline.overdue(9.0) is None
    later = dataclasses.replace(ALL_REDUCE, created_ns=time.time_ns() + 1)
    pending.now = (6, later)
    assert deadline.overdue(10.0) is None
    assert deadline.overdue(11.0) == later


def test_time_at_the_kernels_prompts_is_left_out(tmp_path: Path) -> None:
    deadline, pending, clock = _deadline(tmp_path, 2.0)
    pending.now = (1, ALL_REDUCE)
    write_prompt_clock(clock, 5.0, None)  # earlier prompts, before this collective
    assert deadline.overdue(100.0) is None
    write_prompt_clock(clock, 5.0, 101.0)  # a prompt opens at 101 and stays open
    assert deadline.overdue(150.0) is None  # 50 s in all, 49 of them at the prompt
    write_prompt_clock(clock, 5.0 + 60.0, None)  # it closed at 161
    assert deadline.overdue(161.5) is None  # 1.5 s of waiting
    assert deadline.overdue(162.0) == ALL_REDUCE


def test_the_prompt_clock_file(tmp_path: Path) -> None:
    clock = str(tmp_path / "prompt-clock")
    assert prompt_seconds(clock, 10.0) == 0.0  # no file: no prompt was ever open
    assert not prompt_open(clock)
    write_prompt_clock(clock, 3.5, None)
    assert prompt_seconds(clock, 10.0) == 3.5
    assert not prompt_open(clock)
    write_prompt_clock(clock, 3.5, 8.0)
    assert prompt_seconds(clock, 10.0) == 5.5
    assert prompt_open(clock)  # one is open now (a deadline passing then says so)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prompt-clock"]  # replaced whole
    write_prompt_clock(str(tmp_path / "gone" / "prompt-clock"), 1.0, None)  # no folder: quiet
