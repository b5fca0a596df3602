"""The trackers this rank has started and not finished yet, so that a worker's exit path can
finish them: after a failure or an interrupt (the runs end marked as failed where the library
has the notion) and when ``end_training`` was never called."""

from __future__ import annotations

import sys
import traceback

from ..rank_local import RankLocal
from .base import GeneralTracker

__all__ = ["finish_open_trackers", "forget_tracker", "remember_tracker"]

_open: RankLocal[list[GeneralTracker]] = RankLocal(list)


def remember_tracker(tracker: GeneralTracker) -> None:
    """Note a started tracker."""
    _open.get().append(tracker)


def forget_tracker(tracker: GeneralTracker) -> bool:
    """Note a tracker as finished; False when it was not open (finished already)."""
    trackers = _open.get()
    if not any(t is tracker for t in trackers):
        return False
    trackers[:] = [t for t in trackers if t is not tracker]
    return True


def finish_open_trackers(failed: bool) -> None:
    """Finish every tracker still open on this rank, each on its own: one that fails to
    finish has its error printed and the others are still finished."""
    trackers = _open.get()
    while trackers:
        tracker = trackers.pop()
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
