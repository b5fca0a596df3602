"""The trackers this rank has started and not finished yet, so that a worker's exit path can
finish them: after a failure or an interrupt (the runs end marked as failed where the library
has the notion) and when ``end_training`` was never called.

The kernel hears of each run a tracker can name (:meth:`GeneralTracker._run_reference`) when
it starts and when it ends (:class:`~nb_accel._messages.TrackerRun`), so that it can end the
runs of a rank stopped before it could (SIGKILL, or finishing cut short).
"""

from __future__ import annotations

import sys
import traceback

from ..._messages import TrackerRun
from ..rank_local import RankLocal
from ..sinks import current_sink
from .base import GeneralTracker

__all__ = ["finish_open_trackers", "finish_tracker", "remember_tracker"]

#: The open trackers, each with the event that told the kernel of its run (if any).
_open: RankLocal[list[tuple[GeneralTracker, TrackerRun | None]]] = RankLocal(list)


def _tell_kernel(event: TrackerRun | None) -> None:
    sink = current_sink()
    if event is not None and sink is not None:
        sink.tell(event)


def remember_tracker(tracker: GeneralTracker) -> None:
    """Note a started tracker, and tell the kernel of its run."""
    reference = tracker._run_reference()
    sink = current_sink()
    event = None
    if reference is not None and sink is not None:
        event = TrackerRun(sink.rank, str(tracker.name), *reference)
    _open.get().append((tracker, event))
    _tell_kernel(event)


def _take(tracker: GeneralTracker) -> tuple[bool, TrackerRun | None]:
    """Forget ``tracker``: whether it was open, and its run's event."""
    trackers = _open.get()
    found = [entry for entry in trackers if entry[0] is tracker]
    trackers[:] = [entry for entry in trackers if entry[0] is not tracker]
    return bool(found), found[0][1] if found else None


def _ended(event: TrackerRun | None) -> None:
    if event is not None:
        _tell_kernel(TrackerRun(event.rank, event.tracker, event.run_id, event.location, False))


def finish_tracker(tracker: GeneralTracker) -> None:
    """Finish ``tracker`` if it is open (once: a finished one is left alone), then tell the
    kernel its run ended."""
    was_open, event = _take(tracker)
    if was_open:
        tracker.finish()
        _ended(event)


def finish_open_trackers(failed: bool) -> None:
    """Finish every tracker still open on this rank, each on its own: one that fails to
    finish has its error printed and the others are still finished."""
    trackers = _open.get()
    while trackers:
        tracker, event = trackers.pop()
        try:
            if failed:
                tracker._finish_after_failure()
            else:
                tracker.finish()
        except Exception:  # noqa: BLE001 - the worker is ending; report and go on
            print(
                f"nb_accel: finishing the {getattr(tracker, 'name', '?')} tracker failed:\n"
                + traceback.format_exc(),
                file=sys.stderr,
            )
        else:
            _ended(event)
