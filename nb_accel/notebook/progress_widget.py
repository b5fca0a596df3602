"""The live view of a launch in a notebook: a header, a progress row per rank, metric charts.

:class:`ProgressWidget` implements :class:`~nb_accel.launch.views.view.LaunchView`. It is a pure
view: it does not display itself (the caller displays :attr:`ProgressWidget.widget`), starts no
thread, and sets a widget trait only when its value changes, since each set is a message to the
browser.

Up to :data:`DETAILED_UP_TO` ranks, each rank's row shows its inner bars below it; up to
:data:`MAX_ROWS` ranks, each rank has a compact one-line row. With more ranks, only
:data:`COLLAPSED_ROWS` rows are kept, showing the ranks that need a look (failed, stalled,
stopped, then the least advanced), and one more line sums up the rest (see
:mod:`~nb_accel.notebook.rank_summary`). A report then updates its rank's row if it has one;
which ranks get rows, and the summary line, are brought up to date at most every
:data:`REST_INTERVAL_S` as reports arrive, at each tick, and whenever a rank's state changes.
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable, Sequence
from typing import Any

import ipywidgets

from .._messages import Report
from ..launch.failures.verdict import rank_list
from ..launch.views.stall import ProgressClock, locate_stalled
from ..launch.views.stall import stall_after_s as default_stall_after_s
from . import compat_widgets as compat
from .meter_text import duration_text
from .metrics_chart import MetricsChart
from .rank_row import (
    COLORS,
    DONE,
    FAILED,
    MAX_KEPT_CLOSED,
    RUNNING,
    STARTING,
    STOPPED,
    BarLine,
    RankRow,
    RankState,
    set_changed,
)
from .rank_summary import choose_shown, summarize_rest

__all__ = [
    "COLLAPSED_ROWS",
    "DETAILED_UP_TO",
    "MAX_KEPT_CLOSED",
    "MAX_ROWS",
    "ProgressWidget",
    "RankRow",
    "BarLine",
]

#: Up to this many ranks, each row shows the rank's inner bars below it.
DETAILED_UP_TO = 4
#: Up to this many ranks, every rank has a row.
MAX_ROWS = 8
#: With more ranks than :data:`MAX_ROWS`: the number of rows, beside the line for the rest.
COLLAPSED_ROWS = 6
#: With many ranks, reports choose the ranks with rows and redraw the line for the rest at most
#: this often (seconds).
REST_INTERVAL_S = 0.5


class LaunchBox(ipywidgets.VBox):  # type: ignore[misc]
    """The launch view's root widget; where widgets cannot be drawn (a plain-text front end, a
    notebook saved without widget state) it shows as the launch's title line."""

    def __init__(self, title: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._title_text = title

    def __repr__(self) -> str:
        return self._title_text


class RestLine:
    """The line that sums up the ranks without a row: "58 more", their median bar, their
    spread and a note naming the failed, stalled and stopped ones."""

    def __init__(self) -> None:
        """An empty line."""
        layout = ipywidgets.Layout
        self.label = compat.tip_label(bold=True, layout=layout(width="5em", flex="0 0 auto"))
        self.note = compat.tip_label(layout=layout(min_width="0", flex="0 1 auto", margin="0 6px"))
        self.line = BarLine([self.label], [self.note])
        self.box = self.line.box

    def render(self, states: list[RankState]) -> None:
        """Show ``states``' summary."""
        rest = summarize_rest(states)
        compat.show_text(self.label, rest.label)
        self.line.show(rest.desc, "", rest.value, rest.total, rest.style, rest.text)
        compat.show_text(self.note, rest.note, tooltip=rest.note or None)
        compat.set_text_color(self.note, COLORS[rest.note_color])


def _grouped(boxes: list[Any], hosts: Sequence[str], first_rank: int, collapsed: bool) -> list[Any]:
    """The rows' boxes, each host's under a line with its name (with ranks on more than one
    host and a row for every rank); else as they are."""
    if collapsed or len(set(hosts)) < 2:
        return boxes
    grouped: list[Any] = []
    for index, box in enumerate(boxes):
        host = hosts[index]
        if index == 0 or hosts[index - 1] != host:
            count = hosts[index:].count(host)
            ranks = rank_list(range(first_rank + index, first_rank + index + count))
            line = f"<b>{html.escape(host)}</b> <span style='opacity:0.7'>· {ranks}</span>"
            grouped.append(ipywidgets.HTML(line, layout=ipywidgets.Layout(margin="4px 0 0 0")))
        grouped.append(box)
    return grouped


class ProgressWidget:
    """The notebook view of a launch (a :class:`~nb_accel.launch.views.view.LaunchView`).

    Display :attr:`widget`; the launcher then calls :meth:`started`, :meth:`report`,
    :meth:`returned`, :meth:`failed`, :meth:`stopped`, :meth:`tick` (about once a second) and
    :meth:`finished`. A rank whose bars have not moved for ``stall_after_s`` seconds of
    ``clock`` (default: :func:`~nb_accel.launch.views.stall.stall_after_s`) is marked stalled, once
    any rank has made progress (a launch whose function shows no progress is not) and unless
    it has returned, failed or stopped. Metrics are charted for rank 0, or for every rank with
    ``all_ranks_metrics``.
    """

    def __init__(
        self,
        title: str,
        world_size: int,
        all_ranks_metrics: bool = False,
        stall_after_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        first_rank: int = 0,
        hosts: Sequence[str] | None = None,
    ) -> None:
        """Build the widgets: the header, and the rows in the "starting" state
        (``first_rank``: the number of the first rank, on a later node of a multi-node
        launch; ranks are still addressed from 0). ``hosts`` names each rank's machine in a
        launch across hosts: the rows are grouped under each host's name."""
        self.title = title
        self.world_size = world_size
        self.stall_after_s = stall_after_s if stall_after_s is not None else default_stall_after_s()
        self._clock = clock
        self._started_at = clock()
        self._ended_at: float | None = None
        self._state = RUNNING
        self._progress = ProgressClock(world_size, self._started_at)
        #: What is known of each rank, by rank (counted from 0 on this node).
        places = list(hosts) if hosts is not None else [""] * world_size
        self.ranks = [RankState(first_rank + i, places[i]) for i in range(world_size)]
        self.collapsed = world_size > MAX_ROWS
        detailed = world_size <= DETAILED_UP_TO
        shown = COLLAPSED_ROWS if self.collapsed else world_size
        #: The rows on screen, in order; with few ranks, one per rank, by rank.
        self.rows = [RankRow(self.ranks[index], detailed) for index in range(shown)]
        self._row_of = {index: row for index, row in enumerate(self.rows)}
        #: The line for the ranks without a row (only with more than :data:`MAX_ROWS` ranks).
        self.rest = RestLine() if self.collapsed else None
        self._rest_next = -float("inf")
        self.header = ipywidgets.HTML(layout=ipywidgets.Layout(width="100%"))
        #: Lines kept on show below the rows (where each experiment tracker writes).
        self.notes = ipywidgets.HTML(layout=ipywidgets.Layout(width="100%"))
        self._note_lines: list[str] = []
        self.chart = MetricsChart(all_ranks_metrics, clock)
        boxes = _grouped([row.box for row in self.rows], places, first_rank, self.collapsed)
        boxes += [self.rest.box] if self.rest else []
        self._rows_box = ipywidgets.VBox(boxes)
        #: The root widget to display.
        self.widget = LaunchBox(
            title,
            children=[*compat.stylesheet(), self.header, self._rows_box],
            layout=ipywidgets.Layout(width="100%"),
        )
        self._arrange()
        self._render_header()

    @property
    def series(self) -> dict[str, list[tuple[float, float]]]:
        """The metric series by label (``"loss"``, or ``"loss (rank 1)"`` for all ranks)."""
        return self.chart.series

    @property
    def status(self) -> str:
        """The launch's state: "running", "done", "failed" or "stopped"."""
        return self._state

    def row_for(self, rank: int) -> RankRow | None:
        """The row showing ``rank`` (counted from 0), or ``None`` when it has none now."""
        return self._row_of.get(rank)

    def _rank(self, rank: int) -> RankState | None:
        return self.ranks[rank] if 0 <= rank < len(self.ranks) else None

    def started(self, rank: int, pid: int) -> None:
        """Worker ``rank`` is up (its stall clock starts now)."""
        state = self._rank(rank)
        if state is None:
            return
        state.pid = pid
        self._progress.started(rank, self._clock())
        changed = state.status == STARTING and self._state == RUNNING
        if changed:
            state.status = RUNNING
        self._refresh(rank, changed)

    def report(self, event: Report) -> None:
        """Show a rank's bars (its stalled mark goes when they moved) and chart its metrics."""
        state = self._rank(event.rank)
        if state is None:
            return
        moved = self._progress.moved(event, self._clock())
        changed = state.status == STARTING and self._state == RUNNING
        if changed:
            state.status = RUNNING
        if moved and state.stalled_for is not None:
            state.stalled_for, changed = None, True
        state.update(event.bars)
        self._refresh(event.rank, changed)
        if event.notes:
            self._add_notes(event.notes)
        if event.metrics and self.chart.add(event.rank, event.metrics):
            self._draw_chart(force=False)

    def _end_rank(self, rank: int, status: str, summary: str | None = None) -> None:
        state = self._rank(rank)
        if state is None:
            return
        self._progress.ended(rank)
        state.status, state.stalled_for = status, None
        if summary is not None:
            state.summary = summary
        self._refresh(rank, True)

    def returned(self, rank: int) -> None:
        """``rank``'s function returned: it is finished and never marked stalled."""
        state = self._rank(rank)
        if state is not None and state.status not in (FAILED, STOPPED):
            self._end_rank(rank, DONE)

    def failed(self, rank: int, summary: str) -> None:
        """Mark ``rank`` failed, in red, with the first line of ``summary``."""
        lines = summary.strip().splitlines()
        self._end_rank(rank, FAILED, lines[0] if lines else "error")

    def stopped(self, rank: int, reason: str) -> None:
        """Mark ``rank`` as stopped because of another rank's failure (``reason``); this
        replaces a failure shown for it before."""
        self._end_rank(rank, STOPPED, reason)

    def restarted(self, summary: str) -> None:
        """The group was restarted: a line below the rows says why, and every rank starts
        again (its bars cleared)."""
        self._add_notes((summary,))
        for index, state in enumerate(self.ranks):
            self._progress.ended(index)
            state.status, state.summary, state.stalled_for, state.place = STARTING, "", None, None
            state.bars.clear()
        self._arrange()
        for row in self.rows:
            row.render()
        self._render_header()

    def _refresh(self, rank: int, changed: bool) -> None:
        """Redraw what shows ``rank``: its row, else (not more often than due) the summary
        line; when its state ``changed``, the choice of rows and the header too."""
        row = self._row_of.get(rank)
        if row is not None:
            row.render()
        if changed:
            self._arrange()
            self._render_header()
        elif self.rest is not None and self._clock() >= self._rest_next:
            self._arrange()

    def _arrange(self) -> None:
        """With many ranks: choose the ranks that get rows, and redraw the summary line."""
        if self.rest is None:
            return
        chosen = choose_shown(self.ranks, len(self.rows))
        self._row_of = {}
        for row, index in zip(self.rows, chosen, strict=False):
            row.show(self.ranks[index])
            self._row_of[index] = row
        self.rest.render([s for i, s in enumerate(self.ranks) if i not in self._row_of])
        self._rest_next = self._clock() + REST_INTERVAL_S

    def tick(self) -> None:
        """Mark ranks whose bars have not moved for too long as stalled; draw pending metric
        points; with many ranks, choose again which ranks get rows."""
        if self._state != RUNNING:
            return
        now = self._clock()
        for index, state in enumerate(self.ranks):
            stalled = self._progress.stalled_for(index, now, self.stall_after_s)
            if stalled != state.stalled_for:
                if stalled is not None and state.stalled_for is None:  # newly stalled
                    state.place = locate_stalled(index)
                state.stalled_for = stalled
                row = self._row_of.get(index)
                if row is not None:
                    row.render()
        self._arrange()
        self._render_header()
        self._draw_chart(force=False)

    def finished(self, ok: bool) -> None:
        """End the view: all bars green if ``ok``, else ranks that neither returned nor failed
        are shown stopped."""
        if self._state != RUNNING:
            return
        self._ended_at = self._clock()
        any_failed = any(state.status == FAILED for state in self.ranks)
        self._state = DONE if ok else (FAILED if any_failed else STOPPED)
        for state in self.ranks:
            state.stalled_for = None
            if ok or state.status in (STARTING, RUNNING):
                state.status = DONE if ok else STOPPED
        self._arrange()
        for row in self.rows:
            row.render()
        self._render_header()
        self._draw_chart(force=True)

    def _add_notes(self, notes: tuple[str, ...]) -> None:
        """Show ``notes`` below the rows, one per line, for the rest of the launch."""
        self._note_lines += notes
        lines = "<br>".join(html.escape(line) for line in self._note_lines)
        set_changed(self.notes, value=f"<span style='font-size: 0.9em'>{lines}</span>")
        if self.notes not in self.widget.children:
            children = list(self.widget.children)
            children.insert(children.index(self._rows_box) + 1, self.notes)
            self.widget.children = tuple(children)

    def _draw_chart(self, force: bool) -> None:
        if self.chart.draw(force=force) and self.chart.widget not in self.widget.children:
            self.widget.children = (*self.widget.children, self.chart.widget)

    def _status_text(self) -> tuple[str, str]:
        end = self._ended_at if self._ended_at is not None else self._clock()
        elapsed = end - self._started_at
        failed = [state.rank for state in self.ranks if state.status == FAILED]
        which = f"{rank_list(failed)} failed" if failed else ""
        if self._state == RUNNING:
            stalled = sum(state.stalled_for is not None for state in self.ranks)
            parts = [f"running · {duration_text(elapsed)}"]
            if stalled:
                parts.append(f"{stalled} stalled")
            if which:
                parts.append(which)
            return " · ".join(parts), COLORS["warning" if stalled or failed else "muted"]
        if self._state == DONE:
            return f"done in {duration_text(elapsed, precise=True)}", COLORS["success"]
        if self._state == FAILED:
            status = f"failed after {duration_text(elapsed, precise=True)} · {which}"
            return status, COLORS["danger"]
        return f"stopped after {duration_text(elapsed, precise=True)}", COLORS["warning"]

    def _render_header(self) -> None:
        status, color = self._status_text()
        value = (
            '<div style="display:flex;flex-wrap:wrap;gap:0 0.75em;align-items:baseline">'
            f"<b>{html.escape(self.title)}</b>"
            f'<span class="nb-accel-status" style="color:{color}">{html.escape(status)}</span>'
            "</div>"
        )
        set_changed(self.header, value=value)
