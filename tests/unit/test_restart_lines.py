"""What a restart of the worker group is shown as, and what a failed launch says of the
attempts before its last (no processes: failure records made by hand)."""

from __future__ import annotations

from nb_accel.errors import WorkerFailure
from nb_accel.launch.failures.failure_log import FailureLog
from nb_accel.launch.failures.verdict import died_failure
from nb_accel.launch.multinode.restarts import Restarts, worker_deaths


def _log(*records: WorkerFailure) -> FailureLog:
    log = FailureLog()
    for record in records:
        log.add(record)
    return log


def _raised(rank: int, message: str) -> WorkerFailure:
    return WorkerFailure(rank, "builtins.ValueError", message, "Traceback ...")


def test_each_restart_names_its_cause_and_a_repeat_says_so() -> None:
    restarts = Restarts(3)
    killed = _log(died_failure(1, 4242, -9))
    assert restarts.line(1, killed) == "restart 1 of 3 after rank 1 was killed by SIGKILL"
    again = _log(died_failure(1, 4343, -9))  # another pid: the same failure
    assert (
        restarts.line(2, again) == "restart 2 of 3 after the same failure again (rank 1, SIGKILL)"
    )
    assert (
        restarts.line(3, _log(_raised(0, "bad")))
        == "restart 3 of 3 after rank 0 raised ValueError: bad"
    )
    assert restarts.line(4, FailureLog()) == "restart 4 of 3"


def test_the_root_cause_names_the_restart_not_its_consequences() -> None:
    lost = WorkerFailure(0, "builtins.RuntimeError", "Connection closed by peer", "")
    log = _log(lost, died_failure(1, 4242, -9))
    assert Restarts(1).line(1, log) == "restart 1 of 1 after rank 1 was killed by SIGKILL"


def test_a_failure_on_every_attempt_is_said_once() -> None:
    restarts = Restarts(2)
    for attempt in (1, 2):
        restarts.line(attempt, _log(_raised(attempt % 2, "bad")))  # whichever rank came first
    note = restarts.note(_log(_raised(0, "bad")))
    assert note is not None and note.startswith("This error ended every one of the 3 attempts")
    assert "bad" not in note


def test_different_failures_are_listed_by_attempt() -> None:
    restarts = Restarts(2)
    restarts.line(1, _log(died_failure(1, 4242, -9)))
    note = restarts.note(_log(_raised(0, "bad")))
    assert note == (
        "The worker group was restarted 1 time (max_restarts=2) before this failure: attempt 1 "
        "ended when rank 1 was killed by SIGKILL."
    )
    assert Restarts(2).note(_log(_raised(0, "bad"))) is None  # no restart, nothing to add


def test_deaths_leave_out_reported_ranks_and_those_their_agent_stopped() -> None:
    died = [(0, 10, -9), (1, 11, -15), (0, 12, 1)]
    found = worker_deaths(1, died, 2, reported={2}, stderr_tail={})
    assert found == []  # rank 2 reported; rank 3 was stopped (SIGTERM)
    (record,) = worker_deaths(1, died[:1], 2, reported=set(), stderr_tail={}, host="b")
    assert (record.rank, record.signal_name, record.host) == (2, "SIGKILL", "b")
