"""Which rank's failure the kernel sees: the cause, not the errors that follow from it."""

from __future__ import annotations

from nb_accel.errors import WorkerFailure
from nb_accel.launch.failures import build_exception
from nb_accel.runtime.link_local import _GONE


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
