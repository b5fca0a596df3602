"""The tracker runs a stopped rank left open, ended from the kernel.

A rank stopped by SIGKILL (or by SIGTERM while it cannot unwind within the grace) never
finishes its trackers, and a run kept in a store, such as MLflow's, would stay ``RUNNING``
for ever. Workers tell the kernel of each such run when it opens and when it ends
(:class:`~nb_accel._messages.TrackerRun`); once every worker of the launch is gone, the kernel
ends those still open through the tracker's own library
(:meth:`~nb_accel.runtime.tracking.base.GeneralTracker._end_left_open`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable

from ..._messages import TrackerRun
from ...runtime.tracking.registry import LOGGER_TYPE_TO_CLASS

__all__ = ["OpenRuns", "end_runs_left_open"]


class OpenRuns(dict[tuple[int, str, str], TrackerRun]):
    """The tracker runs ranks opened and have not said they ended, by rank, tracker and run."""

    def note(self, event: TrackerRun) -> None:
        """Keep ``event``'s run if it opened, forget it if it ended."""
        key = (event.rank, event.tracker, event.run_id)
        if event.open:
            self[key] = event
        else:
            self.pop(key, None)


def _to_stderr(note: str) -> None:
    print(note, file=sys.stderr)


def end_runs_left_open(
    runs: Iterable[TrackerRun], say: Callable[[str], None] = _to_stderr
) -> list[TrackerRun]:
    """End each of ``runs`` that its store still shows open, as killed, saying so (on stderr,
    or to ``say``); returns those ended. A run that cannot be ended (its store unreachable,
    say) is reported and skipped: this never raises."""
    ended: list[TrackerRun] = []
    for run in runs:
        tracker_class = LOGGER_TYPE_TO_CLASS.get(run.tracker)
        if tracker_class is None:
            continue
        try:
            if not tracker_class._end_left_open(run.run_id, run.location):
                continue
        except Exception as exc:  # noqa: BLE001 - the launch's own outcome comes first
            say(
                f"nb_accel: could not end the {run.tracker} run {run.run_id} that rank "
                f"{run.rank} left open ({type(exc).__name__}: {exc})"
            )
            continue
        ended.append(run)
        say(
            f"nb_accel: rank {run.rank} was stopped before it ended its {run.tracker} run "
            f"{run.run_id}: ended as killed"
        )
    return ended
