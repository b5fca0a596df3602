"""The live view of a launch in a notebook: a header, one progress row per rank, metric charts.

:class:`ProgressWidget` implements :class:`~nb_accel.launch.view.LaunchView`. It is a pure view:
it does not display itself (the caller displays :attr:`ProgressWidget.widget`), starts no thread,
and sets a widget trait only when its value changes, since each set is a message to the browser.
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable, Iterable
from typing import Any

import ipywidgets

from .._messages import BarState, Report
from .meter_text import duration_text, format_interval, format_meter, known_total
from .metrics_chart import MetricsChart

__all__ = ["ProgressWidget", "RankRow", "BarLine", "format_interval", "format_meter"]

STARTING, RUNNING, DONE, FAILED, STOPPED = "starting", "running", "done", "failed", "stopped"
#: Finished inner bars (``leave=True``) kept on screen per rank; older ones are removed.
MAX_KEPT_CLOSED = 10
COLORS = {"warning": "#ef6c00", "danger": "#d32f2f", "success": "#2e7d32", "muted": "#808080"}
LABEL_WIDTH_EM = 5.0
INDENT_EM = 1.25


def _set(widget: Any, **values: Any) -> None:
    """Set those of ``widget``'s traits whose value differs, in the order given."""
    for name, value in values.items():
        if getattr(widget, name) != value:
            setattr(widget, name, value)


class BarLine:
    """The widgets that show one bar: description, percentage, the bar, and tqdm's text."""

    def __init__(self, lead: Iterable[Any] = (), trail: Iterable[Any] = (), indent_em: float = 0):
        """A line with ``lead`` widgets before the description and ``trail`` ones at the end."""
        layout = ipywidgets.Layout
        self.desc = ipywidgets.Label(layout=layout(max_width="14em", flex="0 0 auto"))
        self.pct = ipywidgets.Label(layout=layout(width="3em", flex="0 0 auto"))
        bar_layout = layout(width="auto", min_width="6em", flex="1 1 30%")
        self.bar = ipywidgets.FloatProgress(value=0.0, min=0.0, max=1.0, layout=bar_layout)
        self.text = ipywidgets.Label(layout=layout(min_width="0", flex="0 1 auto"))
        self.box = ipywidgets.HBox(
            [*lead, self.desc, self.pct, self.bar, self.text, *trail],
            layout=layout(width="100%", align_items="center", padding=f"0 0 0 {indent_em}em"),
        )

    def show(self, desc: str, pct: str, value: float, total: float, style: str, text: str) -> None:
        """Show these values, sending only those that changed."""
        _set(self.desc, value=desc)
        _set(self.pct, value=pct)
        _set(self.bar, max=total, value=min(max(value, 0.0), total), bar_style=style)
        _set(self.text, value=text)

    def close(self) -> None:
        """Close the line's widgets (their models in the browser go too)."""
        for widget in (*self.box.children, self.box):
            widget.layout.close()
            widget.close()


class LaunchBox(ipywidgets.VBox):  # type: ignore[misc]
    """The launch view's root widget; where widgets cannot be drawn (a plain-text front end, a
    notebook saved without widget state) it shows as the launch's title line."""

    def __init__(self, title: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._title_text = title

    def __repr__(self) -> str:
        return self._title_text


class RankRow:
    """One rank: its label, its outermost open bar, a status note, and inner bars below it.

    ``bar``, ``text``, ``desc`` and ``pct`` are the widgets of the shown bar; ``note`` says
    "starting…", "stalled for 42 s", "failed: …" or "stopped"; ``subrows`` maps a bar id to the
    :class:`BarLine` of an inner (or earlier, finished) bar.
    """

    def __init__(self, rank: int) -> None:
        """A row for ``rank`` in the "starting" state."""
        self.rank = rank
        self.status = STARTING
        self.pid: int | None = None
        self.summary = ""
        self.last_seen: float | None = None
        self.stalled_for: float | None = None
        self.bars: dict[int, BarState] = {}
        layout = ipywidgets.Layout
        self.label = ipywidgets.Label(
            f"rank {rank}",
            layout=layout(width=f"{LABEL_WIDTH_EM}em", flex="0 0 auto"),
            style={"font_weight": "bold"},
        )
        self.note = ipywidgets.Label(layout=layout(min_width="0", flex="0 1 auto", margin="0 6px"))
        self.line = BarLine([self.label], [self.note])
        self.desc, self.pct, self.bar, self.text = (
            self.line.desc,
            self.line.pct,
            self.line.bar,
            self.line.text,
        )
        self.subrows: dict[int, BarLine] = {}
        self.sub = ipywidgets.VBox([], layout=layout(width="100%"))
        self.box = ipywidgets.VBox([self.line.box, self.sub], layout=layout(width="100%"))

    def update(self, states: Iterable[BarState]) -> None:
        """Take the bars' latest states (a closed bar with ``leave=False`` goes away)."""
        for state in states:
            if state.closed and not state.leave:
                self.bars.pop(state.bar, None)
            else:
                self.bars[state.bar] = state
        main = self.main_bar()
        closed = [s.bar for s in self.bars.values() if s.closed and s is not main]
        for bar_id in closed[: max(len(closed) - MAX_KEPT_CLOSED, 0)]:
            del self.bars[bar_id]

    def main_bar(self) -> BarState | None:
        """The bar shown in the row: the outermost open one, else the outermost finished one."""
        open_bars = [s for s in self.bars.values() if not s.closed]
        if open_bars:
            return min(open_bars, key=lambda s: s.level)
        finished = list(reversed(self.bars.values()))
        return min(finished, key=lambda s: s.level) if finished else None

    def _style(self, state: BarState | None, is_main: bool) -> str:
        if self.status == FAILED and (is_main or (state is not None and not state.closed)):
            return "danger"
        if self.status == DONE:
            return "success"
        if state is None:
            return "warning" if self.stalled_for is not None else ""
        if state.closed:
            complete = not known_total(state) or state.n >= (state.total or 0)
            return "success" if complete else ""
        if self.stalled_for is not None:
            return "warning"
        return "" if known_total(state) else "info"

    def _show(self, line: BarLine, state: BarState | None, is_main: bool) -> None:
        style = self._style(state, is_main)
        if state is None:
            full = self.status in (DONE, FAILED) or self.stalled_for is not None
            line.show("", "", 1.0 if full else 0.0, 1.0, style, "")
        elif state.total is not None and known_total(state):
            total = float(state.total)
            pct = f"{int(100 * min(max(state.n, 0.0), total) / total)}%"
            line.show(state.desc, pct, float(state.n), total, style, format_meter(state))
        else:  # unknown total: a full bar in the "info" style
            line.show(state.desc, "", 1.0, 1.0, style, format_meter(state))

    def _note(self) -> tuple[str, str]:
        if self.status == FAILED:
            return f"failed: {self.summary}", "danger"
        if self.status == STOPPED:
            return (f"stopped ({self.summary})" if self.summary else "stopped"), "muted"
        if self.status == STARTING and self.stalled_for is None:
            return "starting…", "muted"
        if self.stalled_for is not None:
            return f"stalled for {duration_text(self.stalled_for)}", "warning"
        if not self.bars:
            if self.status == DONE:
                return "done", "success"
            return (f"running (pid {self.pid})" if self.pid else "running"), "muted"
        return "", "muted"

    def heard_from(self, now: float, launch_running: bool) -> None:
        """The rank just reported or started: its stall clock restarts, and it runs."""
        self.last_seen = now
        self.stalled_for = None
        if self.status == STARTING and launch_running:
            self.status = RUNNING

    def render(self) -> None:
        """Bring the widgets up to date with the row's state."""
        main = self.main_bar()
        self._show(self.line, main, is_main=True)
        note, color = self._note()
        _set(self.note, value=note, tooltip=note if self.status == FAILED else None)
        _set(self.note.style, text_color=COLORS[color])
        inner = [s for s in self.bars.values() if s is not main]
        wanted = {s.bar for s in inner}
        for bar_id in [b for b in self.subrows if b not in wanted]:
            self.subrows.pop(bar_id).close()
        for state in inner:
            line = self.subrows.get(state.bar)
            if line is None:
                indent = LABEL_WIDTH_EM + INDENT_EM * max(state.level - 1, 0)
                line = self.subrows[state.bar] = BarLine(indent_em=indent)
            self._show(line, state, is_main=False)
        children = tuple(self.subrows[s.bar].box for s in inner)
        if self.sub.children != children:
            self.sub.children = children


class ProgressWidget:
    """The notebook view of a launch (a :class:`~nb_accel.launch.view.LaunchView`).

    Display :attr:`widget`; the launcher then calls :meth:`started`, :meth:`report`,
    :meth:`failed`, :meth:`tick` (about once a second) and :meth:`finished`. A rank with no report
    for ``stall_after_s`` seconds of ``clock`` is marked stalled once any rank has reported (a
    launch whose function shows no progress is not). Metrics are charted for rank 0, or for every
    rank with ``all_ranks_metrics``.
    """

    def __init__(
        self,
        title: str,
        world_size: int,
        all_ranks_metrics: bool = False,
        stall_after_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        first_rank: int = 0,
    ) -> None:
        """Build the widgets: the header, and one row per rank in the "starting" state
        (``first_rank``: the number of the first row's rank, on a later node of a multi-node
        launch; rows are still addressed from 0)."""
        self.title = title
        self.world_size = world_size
        self.stall_after_s = stall_after_s
        self._clock = clock
        self._started_at = clock()
        self._ended_at: float | None = None
        self._state = RUNNING
        self._any_report = False
        self.header = ipywidgets.HTML(layout=ipywidgets.Layout(width="100%"))
        #: One :class:`RankRow` per rank, by rank.
        self.rows = [RankRow(first_rank + index) for index in range(world_size)]
        self.chart = MetricsChart(all_ranks_metrics, clock)
        self._rows_box = ipywidgets.VBox([row.box for row in self.rows])
        #: The root widget to display.
        self.widget = LaunchBox(
            title, children=[self.header, self._rows_box], layout=ipywidgets.Layout(width="100%")
        )
        for row in self.rows:
            row.render()
        self._render_header()

    @property
    def series(self) -> dict[str, list[tuple[float, float]]]:
        """The metric series by label (``"loss"``, or ``"loss (rank 1)"`` for all ranks)."""
        return self.chart.series

    @property
    def status(self) -> str:
        """The launch's state: "running", "done", "failed" or "stopped"."""
        return self._state

    def _row(self, rank: int) -> RankRow | None:
        return self.rows[rank] if 0 <= rank < len(self.rows) else None

    def started(self, rank: int, pid: int) -> None:
        """Worker ``rank`` is up (its stall clock starts now)."""
        row = self._row(rank)
        if row is None:
            return
        row.pid = pid
        row.heard_from(self._clock(), self._state == RUNNING)
        row.render()
        self._render_header()

    def report(self, event: Report) -> None:
        """Show a rank's bars, clear its stalled mark, and chart its metrics."""
        row = self._row(event.rank)
        if row is None:
            return
        self._any_report = True
        row.heard_from(self._clock(), self._state == RUNNING)
        row.update(event.bars)
        row.render()
        self._render_header()
        if event.metrics and self.chart.add(event.rank, event.metrics):
            self._draw_chart(force=False)

    def failed(self, rank: int, summary: str) -> None:
        """Mark ``rank`` failed, in red, with the first line of ``summary``."""
        row = self._row(rank)
        if row is None:
            return
        lines = summary.strip().splitlines()
        row.summary = lines[0] if lines else "error"
        row.status = FAILED
        row.stalled_for = None
        row.render()
        self._render_header()

    def returned(self, rank: int) -> None:
        """``rank``'s function returned: it is finished and never marked stalled."""
        row = self._row(rank)
        if row is None or row.status == FAILED:
            return
        row.status = DONE
        row.stalled_for = None
        row.render()
        self._render_header()

    def stopped(self, rank: int, reason: str) -> None:
        """Mark ``rank`` as stopped because of another rank's failure (``reason``)."""
        row = self._row(rank)
        if row is None:
            return
        row.status = STOPPED
        row.summary = reason
        row.stalled_for = None
        row.render()
        self._render_header()

    def tick(self) -> None:
        """Mark ranks that have been silent too long as stalled; draw pending metric points."""
        if self._state != RUNNING:
            return
        now = self._clock()
        for row in self.rows:
            row.stalled_for = self._stalled_for(row, now)
            row.render()
        self._render_header()
        self._draw_chart(force=False)

    def _stalled_for(self, row: RankRow, now: float) -> float | None:
        if not self._any_report or row.status not in (STARTING, RUNNING):
            return None
        silent = now - (row.last_seen if row.last_seen is not None else self._started_at)
        return silent if silent >= self.stall_after_s else None

    def finished(self, ok: bool) -> None:
        """End the view: all bars green if ``ok``, else ranks not failed are shown stopped."""
        if self._state != RUNNING:
            return
        self._ended_at = self._clock()
        any_failed = any(row.status == FAILED for row in self.rows)
        self._state = DONE if ok else (FAILED if any_failed else STOPPED)
        for row in self.rows:
            row.stalled_for = None
            if row.status != FAILED:
                row.status = DONE if ok else STOPPED
            row.render()
        self._render_header()
        self._draw_chart(force=True)

    def _draw_chart(self, force: bool) -> None:
        if self.chart.draw(force=force) and self.chart.widget not in self.widget.children:
            self.widget.children = (*self.widget.children, self.chart.widget)

    def _render_header(self) -> None:
        end = self._ended_at if self._ended_at is not None else self._clock()
        elapsed = end - self._started_at
        failed = [row.rank for row in self.rows if row.status == FAILED]
        which = (
            f"rank{'s' if len(failed) > 1 else ''} {', '.join(map(str, failed))} failed"
            if failed
            else ""
        )
        if self._state == RUNNING:
            stalled = sum(row.stalled_for is not None for row in self.rows)
            parts = [f"running · {duration_text(elapsed)}"]
            if stalled:
                parts.append(f"{stalled} stalled")
            if which:
                parts.append(which)
            status, color = " · ".join(parts), COLORS["warning" if stalled or failed else "muted"]
        elif self._state == DONE:
            status, color = f"done in {duration_text(elapsed, precise=True)}", COLORS["success"]
        elif self._state == FAILED:
            status = f"failed after {duration_text(elapsed, precise=True)} · {which}"
            color = COLORS["danger"]
        else:
            status, color = (
                f"stopped after {duration_text(elapsed, precise=True)}",
                COLORS["warning"],
            )
        value = (
            '<div style="display:flex;flex-wrap:wrap;gap:0 0.75em;align-items:baseline">'
            f"<b>{html.escape(self.title)}</b>"
            f'<span class="nb-accel-status" style="color:{color}">{html.escape(status)}</span>'
            "</div>"
        )
        _set(self.header, value=value)
