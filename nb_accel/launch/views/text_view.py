"""The launch view outside a notebook: rank 0's progress bar and a line per event, as text.

On a terminal the bar redraws in place (at most ten times a second); in a log (not a terminal)
it is written as a line of its own at most every few seconds, when a bar finishes, and at the
end, so a CI log stays readable. Failures, ranks stopped by another's failure, and stalled
ranks (see :mod:`~nb_accel.launch.views.stall`) get a line each. The bar line is the one tqdm
draws for rank 0's bar (see :mod:`~nb_accel.launch.views.bar_text`); the latest metrics rank 0
logged follow the bar's postfix (a bar whose own ``bar_format`` has no ``{postfix}`` shows
neither).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import TextIO

from ..._messages import BarState, Report
from .bar_text import meter
from .stall import ProgressClock, locate_stalled
from .stall import stall_after_s as default_stall_after

__all__ = ["TextView"]

#: Width of the bar line on a terminal (characters).
BAR_WIDTH = 100


class TextView:
    """Renders a launch on a text stream (``sys.stderr`` by default).

    Args:
        world_size: number of ranks shown.
        first_rank: the rank of the first of them (in a multi-node launch, this node's first;
            rows are still addressed from 0).
        stream: where to write.
        log_interval: in a log (not a terminal), the shortest time between two bar lines.
        clock: time source (seconds).
        stall_after_s: a rank whose bars have not moved for this long is reported as stalled,
            once (default: :func:`~nb_accel.launch.views.stall.stall_after_s`).
        hosts: each rank's machine, in a launch across hosts (its lines name it).
    """

    def __init__(
        self,
        world_size: int,
        stream: TextIO | None = None,
        log_interval: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        first_rank: int = 0,
        stall_after_s: float | None = None,
        hosts: Sequence[str] | None = None,
    ) -> None:
        self.world_size = world_size
        self.first_rank = first_rank
        self._hosts = list(hosts) if hosts is not None else None
        self._stream = stream if stream is not None else sys.stderr
        isatty = getattr(self._stream, "isatty", None)
        self._tty = bool(isatty()) if callable(isatty) else False
        self._interval = 0.1 if self._tty else log_interval
        self._clock = clock
        self._bars: dict[int, BarState] = {}  # rank 0's bars by id
        self._metrics: dict[str, float] = {}
        self._last_draw = -float("inf")
        self._drawn = ""  # the bar line as last written (terminal) or logged
        self._line_open = False
        self._held = False  # printed output left its line unfinished: no bar until it ends
        self._progress = ProgressClock(world_size, clock())
        self._stall_after = stall_after_s if stall_after_s is not None else default_stall_after()
        self._stall_noted: set[int] = set()

    def _name(self, rank: int) -> str:
        """``"rank 3"``, or ``"rank 3 (node1)"`` in a launch across hosts."""
        name = f"rank {self.first_rank + rank}"
        if self._hosts is not None and 0 <= rank < len(self._hosts):
            name += f" ({self._hosts[rank]})"
        return name

    def started(self, rank: int, pid: int) -> None:
        """Nothing to show; the rank's stall clock starts."""
        self._progress.started(rank, self._clock())

    def _main_bar(self) -> BarState | None:
        open_bars = [b for b in self._bars.values() if not b.closed]
        candidates = open_bars or list(self._bars.values())
        return min(candidates, key=lambda b: (b.level, -b.bar)) if candidates else None

    def _line(self) -> str:
        """Rank 0's main bar as tqdm draws it (its own ``bar_format`` included), with the latest
        metrics after its postfix."""
        bar = self._main_bar()
        if bar is None:
            return ""
        metrics = (f"{k}={v:.4g}" for k, v in self._metrics.items())
        postfix = ", ".join(p for p in (bar.postfix, *metrics) if p)
        return meter(bar, ncols=BAR_WIDTH if self._tty else None, postfix=postfix)

    def _write(self, text: str) -> None:
        try:
            self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError):
            pass  # a closed stream must not break the launch

    def _end_line(self) -> None:
        if self._line_open or (self._held and self._tty):
            self._write("\n")
            self._line_open = self._held = False

    def _draw(self, force: bool = False) -> None:
        now = self._clock()
        if not force and now - self._last_draw < self._interval:
            return
        if self._held:
            if not force:
                return
            self._end_line()  # a final bar goes below the unfinished printed line
            self._held = False
        line = self._line()
        if not line or line == self._drawn:
            return
        self._last_draw, self._drawn = now, line
        if self._tty:
            self._write("\r" + line.ljust(BAR_WIDTH))
            self._line_open = True
        else:
            self._write(line + "\n")

    def clear_bar(self) -> None:
        """Printed output follows: on a terminal, erase the bar and leave the cursor at the
        start of its line; no bar is drawn until :meth:`redraw_bar`."""
        self._held = True
        if self._tty and self._line_open:
            self._write("\r" + " " * max(BAR_WIDTH, len(self._drawn)) + "\r")
            self._line_open = False
            self._drawn = ""

    def redraw_bar(self) -> None:
        """Printed output ended with a complete line: the bar goes below it (on a terminal at
        once; in a log when due)."""
        self._held = False
        self._draw(force=self._tty)

    def report(self, event: Report) -> None:
        """Keep rank 0's bars and metrics; redraw when due."""
        moved = self._progress.moved(event, self._clock())
        for note in event.notes:
            self._end_line()
            self._write(f"nb_accel: {note}\n")
        if moved and event.rank in self._stall_noted:
            self._stall_noted.discard(event.rank)
            self._end_line()
            self._write(f"{self._name(event.rank)} is making progress again\n")
        if event.rank != 0:
            return
        finished_one = False
        for bar in event.bars:
            if bar.closed and not bar.leave:
                self._bars.pop(bar.bar, None)
            else:
                self._bars[bar.bar] = bar
            finished_one = finished_one or (bar.closed and bar.level == 0)
        for _, values in event.metrics:
            self._metrics.update(values)
        self._draw(force=finished_one)

    def failed(self, rank: int, summary: str) -> None:
        """A line for the failure, at once."""
        self._progress.ended(rank)
        self._end_line()
        self._write(f"{self._name(rank)} failed: {summary}\n")

    def returned(self, rank: int) -> None:
        """A finished rank is never reported as stalled."""
        self._progress.ended(rank)

    def stopped(self, rank: int, reason: str) -> None:
        """A line saying the rank stopped because of another's failure."""
        self._progress.ended(rank)
        self._end_line()
        self._write(f"{self._name(rank)} stopped ({reason})\n")

    def restarted(self, summary: str) -> None:
        """A line for the restart, at once; every rank's bars start again."""
        for rank in range(self.world_size):
            self._progress.ended(rank)
        self._stall_noted.clear()
        self._bars.clear()
        self._end_line()
        self._write(f"{summary}\n")

    def tick(self) -> None:
        """Note, once, a rank whose bars have not moved for too long (until they move again)."""
        now = self._clock()
        for rank in range(self.world_size):
            silent = self._progress.stalled_for(rank, now, self._stall_after)
            if silent is None or rank in self._stall_noted:
                continue
            self._stall_noted.add(rank)
            place = locate_stalled(rank)
            self._end_line()
            self._write(
                f"{self._name(rank)} has made no progress for {silent:.0f} s"
                f"{', ' + place.summary if place else ''}\n"
            )

    def finished(self, ok: bool) -> None:
        """The final bar line."""
        for rank in range(self.world_size):
            self._progress.ended(rank)
        self._draw(force=True)
        self._end_line()
