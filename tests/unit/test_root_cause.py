"""Which rank's failure the kernel sees: the cause, not the errors that follow from it."""

from __future__ import annotations

from nb_accel.errors import CollectiveTimeoutError, WorkerDiedError, WorkerFailure
from nb_accel.launch.failures.failure_log import FailureLog
from nb_accel.launch.failures.verdict import build_exception, died_failure
from nb_accel.launch.views.view import NullView
from nb_accel.runtime.data.link_local import _GONE


def _failure(rank: int, error: BaseException) -> WorkerFailure:
    kind = type(error)
    return WorkerFailure(rank, f"{kind.__module__}.{kind.__qualname__}", str(error), "", error)


def test_a_peer_going_away_is_not_taken_for_the_cause() -> None:
    for follow_up in (
        ConnectionError(_GONE),
        ConnectionResetError(104, "Connection reset by peer"),
    ):
        cause = ValueError("sample 13 is corrupt")
        ordered = [_failure(1, follow_up), _failure(0, cause)]  # the follow-up arrived first
        raised = build_exception(ordered, set(), 2, {}, 60.0)
        assert raised is cause
        assert any("rank 0 of 2" in note for note in raised.__notes__)


def test_the_first_of_two_causes_wins() -> None:
    first, second = KeyError("a"), ValueError("b")
    raised = build_exception([_failure(1, first), _failure(0, second)], set(), 2, {}, 60.0)
    assert raised is first


GLOO_LOST = RuntimeError(
    "[pair.cc:553] Connection closed by peer [127.0.0.1]:34724. This is typically caused by a "
    "remote worker crashing. GLHF!"
)


class Shown(NullView):
    """Every call a launch view received, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, str]] = []

    def failed(self, rank: int, summary: str) -> None:
        """Keep it."""
        self.calls.append(("failed", rank, summary))

    def stopped(self, rank: int, reason: str) -> None:
        """Keep it."""
        self.calls.append(("stopped", rank, reason))


def test_a_lost_connection_that_arrives_first_is_not_shown_until_explained() -> None:
    shown = Shown()
    log = FailureLog(shown)
    log.add(_failure(0, GLOO_LOST))
    assert shown.calls == []  # not shown as a failure while its cause may still arrive
    log.add(_failure(1, NameError("name 'x' is not defined")))
    log.settle()
    assert shown.calls == [
        ("stopped", 0, "rank 1 failed"),
        ("failed", 1, "NameError: name 'x' is not defined"),
    ]
    error = log.exception(2, {}, 60.0)
    notes = "\n".join(error.__notes__)
    assert isinstance(error, NameError) and "Rank 0 was stopped by this failure." in notes
    assert "GLHF" not in notes and "Other failures" not in notes


def test_a_lost_connection_with_no_other_failure_is_the_cause() -> None:
    shown = Shown()
    log = FailureLog(shown)
    log.add(_failure(0, GLOO_LOST))
    log.settle()
    assert shown.calls == [("failed", 0, f"RuntimeError: {GLOO_LOST}")]
    assert log.exception(2, {}, 60.0) is GLOO_LOST


def test_a_timeout_that_a_failed_rank_caused_is_a_consequence() -> None:
    shown = Shown()
    log = FailureLog(shown)
    log.timeout_ranks.add(0)
    log.add(_failure(0, RuntimeError("Timed out waiting 2000ms for recv operation")))
    log.add(_failure(1, ValueError("bad shard")))
    log.settle()
    assert ("stopped", 0, "rank 1 failed") in shown.calls
    assert not any(call[0] == "failed" and call[1] == 0 for call in shown.calls)
    error = log.exception(2, {}, 2.0)
    assert isinstance(error, ValueError) and not isinstance(error, CollectiveTimeoutError)


def test_a_timeout_alone_stays_a_collective_timeout() -> None:
    log = FailureLog()
    log.timeout_ranks.add(0)
    log.add(_failure(0, RuntimeError("Timed out waiting 2000ms for recv operation")))
    error = log.exception(2, {1: "was still running"}, 2.0)
    assert isinstance(error, CollectiveTimeoutError)
    assert "Rank 1 did not arrive (was still running)" in str(error)


def test_a_killed_worker_is_the_cause_of_the_others_lost_connections() -> None:
    shown = Shown()
    log = FailureLog(shown)
    log.add(_failure(0, GLOO_LOST))
    log.add(died_failure(1, 4242, -9))
    log.settle()
    assert ("stopped", 0, "rank 1 failed") in shown.calls
    error = log.exception(2, {}, 60.0)
    assert isinstance(error, WorkerDiedError) and "killed by SIGKILL" in str(error)
    assert "Rank 0 was stopped by this failure." in str(error) and "GLHF" not in str(error)


def test_ranks_stopped_without_an_error_of_their_own_are_shown_and_named() -> None:
    shown = Shown()
    log = FailureLog(shown)
    log.add(_failure(1, NameError("name 'x' is not defined")))
    log.settle(unfinished=[0, 2])  # the launcher stopped them once the cause was known
    assert shown.calls == [
        ("failed", 1, "NameError: name 'x' is not defined"),
        ("stopped", 0, "rank 1 failed"),
        ("stopped", 2, "rank 1 failed"),
    ]
    notes = "\n".join(log.exception(3, {}, 60.0).__notes__)
    assert "Ranks 0, 2 were stopped by this failure." in notes


def test_a_rank_relaying_another_node_s_failure_is_shown_stopped() -> None:
    shown = Shown()
    log = FailureLog(shown)
    log.add(_failure(3, ValueError("rank 3 cannot go on")))  # what rank 0 reported
    log.add_stopped(0)
    log.settle()
    assert shown.calls == [
        ("failed", 3, "ValueError: rank 3 cannot go on"),
        ("stopped", 0, "rank 3 failed"),
    ]
    assert "Rank 0 was stopped by this failure." in "\n".join(log.exception(4, {}, 60.0).__notes__)


def test_a_stopped_rank_s_end_is_never_shown_as_its_failure() -> None:
    """A rank that relayed rank 2's failure and then exited (code 1, as a failed worker does, or
    killed by the launch) stays shown stopped by rank 2: its end is not a failure of its own."""
    shown = Shown()
    log = FailureLog(shown)
    log.add(_failure(2, ValueError("rank 2 cannot go on")))
    log.add_stopped(0)
    log.add(died_failure(0, 4242, 1, host="h1"))
    log.add(died_failure(0, 4242, -9, host="h1"))
    log.settle()
    assert shown.calls == [
        ("failed", 2, "ValueError: rank 2 cannot go on"),
        ("stopped", 0, "rank 2 failed"),
    ]
    assert log.ranks == {2}
    raised = log.exception(4, {}, 60.0)
    assert isinstance(raised, ValueError) and str(raised) == "rank 2 cannot go on"


def test_the_cause_is_known_once_an_error_that_explains_the_others_arrived() -> None:
    log = FailureLog()
    log.add(_failure(0, GLOO_LOST))
    assert not log.has_cause  # the launcher keeps listening for it
    log.add(_failure(1, NameError("name 'x' is not defined")))
    assert log.has_cause
    killed = FailureLog()
    killed.add(died_failure(1, 4242, -9))
    assert killed.has_cause
