"""One dispatcher for the events of a launch's workers, whichever launcher started them.

:class:`EventDispatcher` passes :class:`Output` to the output printer, :class:`Report` and
:class:`Started` to the launch view, keeps :class:`Result` data and records :class:`Failure`
events in a :class:`~nb_accel.launch.failures.failure_log.FailureLog` (which keeps the view in
step with the root cause), and keeps the tracker runs the ranks have open (:class:`TrackerRun`).
What a launcher adds is a :class:`DispatchHooks`: showing what a worker wrote to its file
descriptors before a change of its state, ignoring the late words of an earlier attempt, events
of its own (a pool's ``CellDone``). :meth:`EventDispatcher.wake`
ticks the view and writes held-back output when due, for every launcher's event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..._messages import Event, Failure, Output, Report, Result, Started, TrackerRun
from ...errors import WorkerFailure
from ..failures.failure_log import FailureLog
from ..views.view import LaunchView, NullView
from .left_open_runs import OpenRuns

__all__ = ["TICK_S", "DispatchHooks", "EventDispatcher"]

#: How often a launch view is ticked (seconds).
TICK_S = 1.0


class DispatchHooks:
    """What a launcher adds to the dispatch of its workers' events; each does nothing here.

    ``sender`` is whatever the launcher names an event's source by (a worker, a connection),
    or ``None``.
    """

    def before_change(self, sender: Any) -> None:
        """Called before an event that may change a rank's state (anything but output and
        progress): show what the worker wrote to its file descriptors first."""

    def started(self, event: Started, sender: Any) -> None:
        """A rank started (called before the view hears of it)."""

    def current(self, sender: Any) -> bool:
        """Whether events from ``sender`` still count (False: the late words of an attempt
        the group was restarted after; only output is then shown)."""
        return True

    def rank_of(self, sender: Any) -> int | None:
        """The rank that sent events from ``sender``, when the launcher knows it: a failure
        reported for another rank marks that sender as stopped by it."""
        return None

    def ended(self, event: Result | Failure) -> None:
        """A rank's function ended: its result or failure, once recorded (a launch's ranks
        reply to their first command so)."""

    def other(self, event: Event, sender: Any) -> None:
        """An event the dispatcher does not know (a pool's ``CellDone``)."""


#: The hooks of a dispatcher whose launch is over (or that was given none).
_NO_HOOKS = DispatchHooks()


class EventDispatcher:
    """Acts on the events of one launch's workers.

    Args:
        on_output: given each :class:`Output` event.
        view: told of starts, progress, results and failures; ``None`` for none (then it is
            not ticked either).
        hooks: what the launcher adds.
        flush_output: writes held-back output when due and returns the seconds until more is
            due (``None``: nothing held); called by :meth:`wake`.

    Attributes:
        results: the ranks' pickled results, by rank.
        failures: the failures so far.
        open_runs: the tracker runs the ranks opened and have not said they ended, by rank,
            tracker and run (for the kernel to end those a stopped rank leaves open).
    """

    def __init__(
        self,
        on_output: Callable[[Output], None],
        view: LaunchView | None,
        hooks: DispatchHooks | None = None,
        flush_output: Callable[[], float | None] | None = None,
    ) -> None:
        self.on_output = on_output
        self._hooks = hooks if hooks is not None else _NO_HOOKS
        self._flush_output = flush_output
        self._next_tick = time.monotonic() + TICK_S
        self.results: dict[int, bytes] = {}
        self.failures = FailureLog(view)
        self.open_runs = OpenRuns()
        self._given_view = view
        self.view: LaunchView = view if view is not None else NullView()

    def set_view(self, view: LaunchView | None) -> None:
        """Show what follows on ``view`` (a pool's next command)."""
        self._given_view = self.failures.view = view
        self.view = view if view is not None else NullView()

    def close(self) -> None:
        """The launch is over: let go of the launcher's hooks. The launcher holds this
        dispatcher and the hooks are usually the launcher itself, so keeping them would leave
        the two, and the pipes and views they hold, for the garbage collector. The results,
        failures and open runs stay to be read; an event handled from now on goes through no
        hooks."""
        self._hooks = _NO_HOOKS

    def new_attempt(self) -> None:
        """Forget the results and failures so far: the group was restarted (or a pool's dead
        ranks replaced)."""
        self.results.clear()
        self.failures = FailureLog(self._given_view)

    def handle(self, event: Event, sender: Any = None) -> None:
        """Act on one event from a worker (``sender``: where it came from, for the hooks)."""
        if isinstance(event, Output):
            self.on_output(event)
            return
        if isinstance(event, TrackerRun):  # of an earlier attempt too: the run is real
            self.open_runs.note(event)
            return
        if not isinstance(event, Report):
            self._hooks.before_change(sender)
        if isinstance(event, Started):
            self._hooks.started(event, sender)
            self.view.started(event.rank, event.pid)
            return
        if not self._hooks.current(sender):
            return
        if isinstance(event, Report):
            self.view.report(event)
        elif isinstance(event, Result):
            self.results[event.rank] = event.data
            self.view.returned(event.rank)
            self._hooks.ended(event)
        elif isinstance(event, Failure):
            self._failed(event, self._hooks.rank_of(sender))
            self._hooks.ended(event)
        else:
            self._hooks.other(event, sender)

    def record_failure(self, event: Failure) -> None:
        """Record ``event``, a failure no worker here sent (another node's ranks recorded it),
        once."""
        self._failed(event, None)

    def _failed(self, event: Failure, sender_rank: int | None) -> None:
        """Record ``event`` once (another rank may relay the same failure)."""
        if not any(_same(event, seen) for seen in self.failures.records):
            self.failures.add_event(event)
        if sender_rank is not None and sender_rank != event.rank:
            self.failures.add_stopped(sender_rank)  # it lost its peers, and says which failed

    def wake(self) -> float | None:
        """Tick the view and write held-back output, each when due; returns the seconds until
        one of them is due again (``None``: neither is)."""
        timeout: float | None = None
        if self._given_view is not None:
            now = time.monotonic()
            if now >= self._next_tick:
                self.view.tick()
                self._next_tick = now + TICK_S
            timeout = self._next_tick - now
        if self._flush_output is not None and (due := self._flush_output()) is not None:
            timeout = due if timeout is None else min(timeout, due)
        return timeout


def _same(event: Failure, record: WorkerFailure) -> bool:
    return (event.rank, event.type_name, event.message) == (
        record.rank,
        record.type_name,
        record.message,
    )
