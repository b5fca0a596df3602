"""What a rank reports when its function ends: the :class:`Result` with its return value, or
the :class:`Failure` that says what went wrong (its type, message and traceback, and whether it
was a collective that outlasted the launch's timeout)."""

from __future__ import annotations

import dataclasses
import time
from types import TracebackType
from typing import Any

import torch.distributed as dist

from ..._messages import Failure, Result
from ...runtime.process_group import applied_timeout_s
from ..reporting.collective_trail import collective_raised_in
from .folded_frames import folded_traceback
from .returns import check_returnable, dumps_result

__all__ = [
    "Outcome",
    "deadline_failure",
    "failure_event",
    "result_event",
    "is_timeout_error",
    "waited_in_another",
]

#: What a rank's function came to: its return value, ready to travel, or its failure.
Outcome = Result | Failure

_TIMEOUT_MARKERS = ("timed out", "timeout", "time out")
#: Texts of a backend that failed to connect to its peers (gloo's "timed out connecting:
#: Connection refused"): a network problem, not a collective that waited too long.
_CONNECT_MARKERS = ("timed out connecting", "connection refused", "connectfullmesh")


def is_timeout_error(exc: BaseException) -> bool:
    """True for errors raised by a collective that exceeded the launch's timeout (a backend
    that could not even connect to its peers, "timed out connecting", is not one)."""
    text = str(exc).lower()
    if any(marker in text for marker in _CONNECT_MARKERS):
        return False
    return any(marker in text for marker in _TIMEOUT_MARKERS) and (
        isinstance(exc, (RuntimeError, dist.DistError)) or "Dist" in type(exc).__name__
    )


def _user_traceback(exc: BaseException, own_files: tuple[str, ...]) -> str:
    """The exception's traceback without the leading frames of ``own_files``, nb_accel's
    frames after them folded (:func:`~.folded_frames.folded_traceback`)."""
    tb: TracebackType | None = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in own_files:
        tb = tb.tb_next
    return folded_traceback(exc, tb)


def _pickled(exc: BaseException) -> bytes | None:
    """``exc`` pickled to travel, or ``None`` when it cannot be."""
    try:
        return dumps_result(exc, shared=False)
    except Exception:  # noqa: BLE001 - any failure here is reported, never raised
        return None


def failure_event(rank: int, exc: BaseException, own_files: tuple[str, ...] = ()) -> Failure:
    """The :class:`Failure` event for ``exc`` on ``rank``; the traceback leaves out the
    leading frames of ``own_files`` (the worker's machinery)."""
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - any failure here is reported, never raised
        message = f"<str() of {type(exc).__name__} failed>"
    data = _pickled(exc)
    timed_out = is_timeout_error(exc)
    found = collective_raised_in(exc) if timed_out else None
    return Failure(
        rank=rank,
        type_name=f"{type(exc).__module__}.{type(exc).__qualname__}",
        message=message,
        traceback=_user_traceback(exc, (__file__, *own_files)),
        data=data,
        is_timeout=timed_out,
        timeout_s=applied_timeout_s() if timed_out else None,
        collective=found.describe() if found else "",
        at=time.time(),
    )


def deadline_failure(
    rank: int, message: str, collective: str, stack: str, at_prompt: bool = False
) -> Failure:
    """The :class:`Failure` of rank ``rank`` waiting in ``collective`` past the launch's
    timeout, as :class:`~nb_accel.worker.debugging.deadline.CollectiveDeadline` finds it
    (``stack``: where the rank waits; ``at_prompt``: one of the kernel's prompts was open
    then)."""
    data = _pickled(TimeoutError(message))
    return Failure(
        rank=rank,
        type_name="builtins.TimeoutError",
        message=message,
        traceback=f"{stack}TimeoutError: {message}\n",
        data=data,
        is_timeout=True,
        timeout_s=applied_timeout_s(),
        collective=collective,
        at_prompt=at_prompt,
        at=time.time(),
    )


def waited_in_another(
    rank: int, exc: BaseException, gave_up: Failure, own_files: tuple[str, ...] = ()
) -> Failure | None:
    """Rank ``rank``'s own wait, as a timeout, when its collective failed with ``exc`` (its
    connections closed) because the rank of ``gave_up`` timed out waiting for it in another
    collective: the two called different collectives, and this one was not late to the
    other's (``None``: it was in that same collective, or either is not known)."""
    mine = collective_raised_in(exc)
    if mine is None or not gave_up.collective:
        return None
    own = mine.describe()
    if _base(own) == _base(gave_up.collective):
        return None
    message = (
        f"rank {rank} was waiting in {_base(own)} when rank {gave_up.rank}, waiting for it in "
        f"{_base(gave_up.collective)}, gave up: the ranks called different collectives"
    )
    waited = failure_event(rank, TimeoutError(message).with_traceback(exc.__traceback__), own_files)
    return dataclasses.replace(
        waited, is_timeout=True, timeout_s=applied_timeout_s(), collective=own
    )


def _base(described: str) -> str:
    """A collective as :meth:`LastCollective.describe` says it, without its state (one rank
    may see it finished where another does not): ``all_reduce #3``."""
    return described.split(", ")[0]


def result_event(rank: int, value: Any) -> Outcome:
    """The event that sends ``value``, rank ``rank``'s return value, to the kernel (every
    tensor in it on the CPU), or a :class:`Failure` saying why it cannot travel."""
    try:
        check_returnable(value)
    except TypeError as refused:
        return failure_event(rank, refused)
    try:
        return Result(rank, dumps_result(value), at=time.time())
    except Exception as exc:  # noqa: BLE001 - reported to the kernel
        error = TypeError(
            f"rank {rank} returned a {type(value).__name__} that cannot be sent back to the "
            f"kernel ({exc}); return plain data (numbers, tensors, lists, dicts) "
            "or save it to a file"
        )
        return failure_event(rank, error)
