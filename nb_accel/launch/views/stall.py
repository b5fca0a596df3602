"""When a rank counts as stalled: it has made no progress for a while, and has not ended.

Progress means that the rank's bars moved: a bar's count changed, a bar appeared or finished,
or the rank logged metrics. A report that only redraws a bar is no sign of life: tqdm's
monitor thread redraws a bar that has not been drawn for ten seconds (its ``maxinterval``),
and a bar redraws on ``refresh()`` or a new postfix, all with the same count, while the rank
may be stuck. A rank that returned, failed or was stopped is never stalled.

The threshold is :data:`STALL_AFTER_S` seconds, or ``$NB_ACCEL_STALL_AFTER_S``; time the kernel
spends at a rank's prompt (:func:`note_prompt_time`) does not count. A view that
marks a rank stalled asks :func:`locate_stalled` where it is: the running launch answers
(:func:`locating`) with a :class:`Location`, its stack's summary and every thread's frames.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..._messages import Report

__all__ = [
    "STALL_AFTER_ENV",
    "STALL_AFTER_S",
    "Location",
    "ProgressClock",
    "locate_stalled",
    "locating",
    "note_prompt_time",
    "stall_after_s",
]

#: Seconds this kernel has spent waiting at ranks' prompts (a debugger's, ``input()``'s): no
#: rank is expected to make progress then, so they do not count towards a stall.
_at_prompts = [0.0]


def note_prompt_time(seconds: float) -> None:
    """The kernel waited ``seconds`` at a rank's prompt (the user typing): not a stall."""
    _at_prompts[0] += max(0.0, seconds)


@dataclass(frozen=True)
class Location:
    """Where a rank is: ``summary`` in one line (``at `f` (Cell In[3], line 4)``), ``stack``
    every thread's frames (empty when unknown)."""

    summary: str
    stack: str = ""


#: How the running launch says where a rank is (innermost launch last).
_locators: list[Callable[[int], Location | None]] = []


@contextlib.contextmanager
def locating(locate: Callable[[int], Location | None]) -> Iterator[None]:
    """While the block runs, :func:`locate_stalled` asks ``locate`` (a view's rank index to
    where that rank is, or ``None``)."""
    _locators.append(locate)
    try:
        yield
    finally:
        _locators.remove(locate)


def locate_stalled(rank: int) -> Location | None:
    """Where the running launch's rank ``rank`` (a view's index) is, when the launch can
    say."""
    return _locators[-1](rank) if _locators else None


#: Seconds without progress after which a rank is shown as stalled.
STALL_AFTER_S = 30.0
#: The environment variable that overrides :data:`STALL_AFTER_S` (seconds, a positive number).
STALL_AFTER_ENV = "NB_ACCEL_STALL_AFTER_S"


def stall_after_s() -> float:
    """The stall threshold in seconds: ``$NB_ACCEL_STALL_AFTER_S`` when it holds a positive
    number, else :data:`STALL_AFTER_S`."""
    raw = os.environ.get(STALL_AFTER_ENV, "").strip()
    try:
        value = float(raw)
    except ValueError:
        return STALL_AFTER_S
    return value if value > 0 and math.isfinite(value) else STALL_AFTER_S


class ProgressClock:
    """When each rank of a launch last made progress (times from the caller's clock).

    Args:
        world_size: number of ranks, addressed from 0.
        now: the launch's start; a rank's clock runs from here until it starts.
    """

    def __init__(self, world_size: int, now: float) -> None:
        self._since = [now] * world_size
        self._prompts_then = [_at_prompts[0]] * world_size  # prompt time when _since was set
        self._counts: list[dict[int, tuple[float, float | None]]] = [{} for _ in range(world_size)]
        self._ended = [False] * world_size
        #: Whether any rank has made progress yet (until then no rank is stalled: a function
        #: that shows no progress is not stuck for want of it).
        self.any_progress = False

    def started(self, rank: int, now: float) -> None:
        """``rank``'s worker is up: its clock starts now."""
        if 0 <= rank < len(self._since):
            self._since[rank] = now
            self._prompts_then[rank] = _at_prompts[0]

    def moved(self, event: Report, now: float) -> bool:
        """Take a report; True (and ``event.rank``'s clock restarts) when it shows progress."""
        rank = event.rank
        if not 0 <= rank < len(self._since):
            return False
        counts = self._counts[rank]
        moved = bool(event.metrics)
        for bar in event.bars:
            if bar.closed:  # reported once, when the bar finishes
                counts.pop(bar.bar, None)
                moved = True
                continue
            seen = (bar.n, bar.total)
            moved = moved or counts.get(bar.bar) != seen
            counts[bar.bar] = seen
        if moved:
            self._since[rank] = now
            self._prompts_then[rank] = _at_prompts[0]
            self.any_progress = True
        return moved

    def ended(self, rank: int) -> None:
        """``rank`` returned, failed or was stopped: it is never stalled from now on."""
        if 0 <= rank < len(self._ended):
            self._ended[rank] = True
            self._counts[rank].clear()

    def is_ended(self, rank: int) -> bool:
        """Whether :meth:`ended` was called for ``rank``."""
        return 0 <= rank < len(self._ended) and self._ended[rank]

    def stalled_for(self, rank: int, now: float, after: float) -> float | None:
        """How long ``rank`` has made no progress, when that is at least ``after`` seconds and
        it is stalled (some rank made progress, and it has not ended); else ``None``."""
        if not self.any_progress or self.is_ended(rank) or not 0 <= rank < len(self._since):
            return None
        silent = now - self._since[rank] - (_at_prompts[0] - self._prompts_then[rank])
        return silent if silent >= after else None
