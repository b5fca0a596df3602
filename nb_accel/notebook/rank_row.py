"""One rank in the launch view: what is known of it (:class:`RankState`) and the row of widgets
that shows it (:class:`RankRow`).

A row sets a widget trait only when its value changes, since each set is a message to the
browser. A row can be pointed at another rank (:meth:`RankRow.show`): with many ranks the view
keeps a few rows and shows in them the ranks that need a look.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import ipywidgets

from .._messages import BarState
from ..launch.views.stall import Location
from . import compat_widgets as compat
from .meter_text import bar_texts, count_of, duration_text, known_total

__all__ = [
    "BarLine",
    "COLORS",
    "DONE",
    "FAILED",
    "MAX_KEPT_CLOSED",
    "RUNNING",
    "RankRow",
    "RankState",
    "STARTING",
    "STOPPED",
    "set_changed",
]

STARTING, RUNNING, DONE, FAILED, STOPPED = "starting", "running", "done", "failed", "stopped"
#: Finished inner bars (``leave=True``) kept on screen per rank; older ones are removed.
MAX_KEPT_CLOSED = 10
#: Text colours of the notes and the header, by meaning.
COLORS = compat.PALETTE
LABEL_WIDTH_EM = 5.0
INDENT_EM = 1.25


def set_changed(widget: Any, **values: Any) -> None:
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
        set_changed(self.desc, value=desc)
        set_changed(self.pct, value=pct)
        set_changed(self.bar, max=total, value=min(max(value, 0.0), total), bar_style=style)
        set_changed(self.text, value=text)

    def close(self) -> None:
        """Close the line's widgets (their models in the browser go too)."""
        for widget in (*self.box.children, self.box):
            widget.layout.close()
            widget.close()


class RankState:
    """What the view knows of one rank: its status, its bars, and how long it has been stalled.

    ``status`` is "starting", "running", "done", "failed" or "stopped"; ``summary`` is the
    failure's first line or the reason the rank was stopped.
    """

    def __init__(self, rank: int, host: str = "") -> None:
        """A rank in the "starting" state (on ``host``, in a launch across hosts)."""
        self.rank = rank
        #: The machine the rank runs on, in a launch across hosts (``""``: this one).
        self.host = host
        self.status = STARTING
        self.pid: int | None = None
        self.summary = ""
        self.stalled_for: float | None = None
        #: Where the rank was when it was marked stalled (its stack), if known.
        self.place: Location | None = None
        self.bars: dict[int, BarState] = {}

    @property
    def ended(self) -> bool:
        """Whether the rank returned, failed or was stopped."""
        return self.status in (DONE, FAILED, STOPPED)

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

    def progress(self) -> tuple[float, ...]:
        """How far the rank got, outermost bar first (a fraction of a known total, else the
        count): ranks compare by it, the least advanced first; finished ranks come last."""
        if self.status == DONE:
            return (float("inf"),)
        open_bars = sorted((s for s in self.bars.values() if not s.closed), key=lambda s: s.level)
        if not open_bars:
            main = self.main_bar()
            return (1.0,) if main is not None else ()
        return tuple(s.n / (s.total or 1.0) if known_total(s) else s.n for s in open_bars)

    def note(self) -> tuple[str, str]:
        """The status note and its colour name (see :data:`COLORS`)."""
        if self.status == FAILED:
            return f"failed: {self.summary}", "danger"
        if self.status == STOPPED:
            return (f"stopped ({self.summary})" if self.summary else "stopped"), "muted"
        if self.stalled_for is not None:
            place = f", {self.place.summary}" if self.place else ""
            return f"stalled for {duration_text(self.stalled_for)}{place}", "warning"
        if self.status == STARTING:
            return "starting…", "muted"
        if not self.bars:
            if self.status == DONE:
                return "done", "success"
            return (f"running (pid {self.pid})" if self.pid else "running"), "muted"
        return "", "muted"

    def tooltip(self) -> str | None:
        """What the status note shows on hover: a failure whole, a stalled rank's stack."""
        if self.status == FAILED:
            return self.note()[0]
        if self.stalled_for is not None and self.place is not None and self.place.stack:
            return self.place.stack
        return None

    def style(self, state: BarState | None, is_main: bool) -> str:
        """The bar style of ``state`` (the row's main bar when ``is_main``) in this rank."""
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


def _inner_text(inner: Iterable[BarState]) -> str:
    """The open inner bars of a compact row, briefly: `` · batch 40/100``."""
    parts = [f"{s.desc or 'bar'} {count_of(s)}".strip() for s in inner if not s.closed]
    return "".join(f" · {part}" for part in parts)


class RankRow:
    """The widgets of one rank: its label, its outermost open bar, a status note, and (in a
    detailed row) its inner bars below; a compact row names the open inner bars in its text.

    ``bar``, ``text``, ``desc`` and ``pct`` are the widgets of the shown bar; ``note`` says
    "starting…", "stalled for 42 s", "failed: …" or "stopped (…)"; ``subrows`` maps a bar id to
    the :class:`BarLine` of an inner (or earlier, finished) bar.
    """

    def __init__(self, state: RankState, detailed: bool = True) -> None:
        """A row showing ``state``."""
        self.state = state
        self.detailed = detailed
        layout = ipywidgets.Layout
        self.label = compat.tip_label(
            bold=True, layout=layout(width=f"{LABEL_WIDTH_EM}em", flex="0 0 auto")
        )
        self.note = compat.tip_label(layout=layout(min_width="0", flex="0 1 auto", margin="0 6px"))
        self.line = BarLine([self.label], [self.note])
        self.desc, self.pct, self.bar, self.text = (
            self.line.desc,
            self.line.pct,
            self.line.bar,
            self.line.text,
        )
        self.subrows: dict[int, BarLine] = {}
        self.sub = ipywidgets.VBox([], layout=layout(width="100%"))
        children = [self.line.box, self.sub] if detailed else [self.line.box]
        self.box = ipywidgets.VBox(children, layout=layout(width="100%"))
        self.render()

    @property
    def rank(self) -> int:
        """The rank shown."""
        return self.state.rank

    @property
    def status(self) -> str:
        """The shown rank's status."""
        return self.state.status

    @property
    def stalled_for(self) -> float | None:
        """How long the shown rank has been stalled, or ``None``."""
        return self.state.stalled_for

    def show(self, state: RankState) -> None:
        """Show another rank in this row."""
        if state is not self.state:
            self.state = state
            self.render()

    def _show_bar(self, line: BarLine, bar: BarState | None, is_main: bool, tail: str) -> None:
        state = self.state
        style = state.style(bar, is_main)
        if bar is None:
            full = state.status in (DONE, FAILED) or state.stalled_for is not None
            line.show("", "", 1.0 if full else 0.0, 1.0, style, "")
            return
        desc, pct, text = bar_texts(bar)
        if bar.total is not None and known_total(bar):
            line.show(desc, pct, float(bar.n), float(bar.total), style, text + tail)
        else:  # unknown total: a full bar in the "info" style
            line.show(desc, pct, 1.0, 1.0, style, text + tail)

    def render(self) -> None:
        """Bring the widgets up to date with the rank's state."""
        state = self.state
        main = state.main_bar()
        inner = [s for s in state.bars.values() if s is not main]
        compat.show_text(self.label, f"rank {state.rank}", tooltip=state.host or None)
        self._show_bar(self.line, main, True, "" if self.detailed else _inner_text(inner))
        note, color = state.note()
        compat.show_text(self.note, note, tooltip=state.tooltip())
        compat.set_text_color(self.note, COLORS[color])
        if self.detailed:
            self._render_inner(inner)

    def _render_inner(self, inner: list[BarState]) -> None:
        wanted = {s.bar for s in inner}
        for bar_id in [b for b in self.subrows if b not in wanted]:
            self.subrows.pop(bar_id).close()
        for bar in inner:
            line = self.subrows.get(bar.bar)
            if line is None:
                indent = LABEL_WIDTH_EM + INDENT_EM * max(bar.level - 1, 0)
                line = self.subrows[bar.bar] = BarLine(indent_em=indent)
            self._show_bar(line, bar, False, "")
        children = tuple(self.subrows[s.bar].box for s in inner)
        if self.sub.children != children:
            self.sub.children = children
