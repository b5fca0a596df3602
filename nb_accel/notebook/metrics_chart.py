"""Live metric charts: the series are kept in Python and drawn as inline SVG in an ipywidgets HTML.

One small chart per metric name (small multiples, so metrics of very different scales each get a
readable y axis), one line per series in it: the metric of rank 0, or of every rank when all ranks'
metrics are shown. The HTML also carries the full series as JSON, in
``<script type="application/json" class="nb-accel-series">``, so that the data can be read back
from a saved notebook's widget state (see :func:`parse_series`).
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import ipywidgets

from .._messages import MetricPoint

__all__ = [
    "MAX_DRAWN_POINTS",
    "SERIES_CLASS",
    "MetricsChart",
    "downsample",
    "nice_ticks",
    "render_charts",
    "parse_series",
]

#: The most points one line is drawn with (the full series stays in Python and in the JSON).
MAX_DRAWN_POINTS = 500
#: Class of the ``<script type="application/json">`` element that holds the series.
SERIES_CLASS = "nb-accel-series"
#: While points keep arriving, the chart is redrawn at most this often (seconds).
DRAW_INTERVAL_S = 1.0
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
#: Size of one chart and the margins of its plot area, in pixels (the bottom margin holds the
#: x axis's tick labels and its name).
WIDTH, HEIGHT = 320, 184
LEFT, RIGHT, TOP, BOTTOM = 48, 10, 8, 34
#: The x axis's name: a point's x is its step (or, logged without one, its number).
X_LABEL = "step"

Point = tuple[float, float]


@dataclass
class Line:
    """One series as drawn: its metric, rank, label, colour, points and latest value."""

    metric: str
    rank: int
    label: str
    color: str
    points: list[Point] = field(default_factory=list)
    latest: float = math.nan


def downsample(points: Sequence[Point], limit: int = MAX_DRAWN_POINTS) -> list[Point]:
    """At most ``limit`` of ``points`` in their order: the first, the last, and the lowest and
    highest point of each of ``(limit - 2) // 2`` equal runs in between (spikes stay visible)."""
    count = len(points)
    if count <= limit:
        return list(points)
    runs = max((limit - 2) // 2, 1)
    inner = count - 2
    kept = [points[0]]
    for run in range(runs):
        start, end = 1 + run * inner // runs, 1 + (run + 1) * inner // runs
        if start >= end:
            continue
        low = min(range(start, end), key=lambda i: points[i][1])
        high = max(range(start, end), key=lambda i: points[i][1])
        kept.extend(points[i] for i in sorted({low, high}))
    kept.append(points[-1])
    return kept


def nice_ticks(low: float, high: float, count: int = 4, integer: bool = False) -> list[float]:
    """About ``count`` round values (1, 2, 2.5 or 5 times a power of ten apart) in [low, high]."""
    span = high - low
    if not (math.isfinite(span) and span > 0):
        return [low]
    raw = span / count
    magnitude = 10.0 ** math.floor(math.log10(raw))
    factors = (1.0, 2.0, 5.0, 10.0) if integer else (1.0, 2.0, 2.5, 5.0, 10.0)
    step = next(f * magnitude for f in factors if f * magnitude >= raw * (1 - 1e-9))
    if integer:
        step = max(step, 1.0)
    first = math.ceil(low / step - 1e-9)
    ticks: list[float] = []
    index = first
    while index * step <= high + step * 1e-9:
        value = index * step
        ticks.append(0.0 if abs(value) < step * 1e-9 else value)
        index += 1
    return ticks


def _tick_label(value: float, step: float) -> str:
    if value != 0 and (abs(value) >= 1e6 or step < 1e-4):
        return f"{value:.3g}"
    decimals = max(0, -math.floor(math.log10(step) + 1e-9)) if step > 0 else 0
    if decimals and not math.isclose(round(step, decimals), step, rel_tol=1e-9):
        decimals += 1  # steps such as 0.25
    return f"{value:.{decimals}f}"


def format_value(value: float) -> str:
    """A metric value for the legend: four significant digits."""
    if not math.isfinite(value):
        return str(value)
    if value == int(value) and abs(value) < 1e6:
        return str(int(value))
    return f"{value:.4g}"


def _range(values: Iterable[float], pad_fraction: float) -> tuple[float, float]:
    low, high = math.inf, -math.inf
    for value in values:
        low, high = min(low, value), max(high, value)
    if high == low:
        spread = abs(low) * 0.1 or 1.0
        return low - spread, high + spread
    pad = (high - low) * pad_fraction
    return low - pad, high + pad


def _svg(metric: str, lines: Sequence[Line]) -> str:
    drawn = [line for line in lines if line.points]
    box = f'width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}"'
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" {box} role="img" class="nb-accel-chart" '
        f'data-metric="{html.escape(metric)}" '
        'style="display:block;overflow:visible;font-family:inherit">'
    )
    if not drawn:
        note = "no finite values yet"
        text = f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" font-size="11"'
        return f'{head}{text} fill="currentColor" fill-opacity="0.6">{note}</text></svg>'
    xs = {x for line in drawn for x, _ in line.points}
    x_low, x_high = _range(xs, 0.0)
    y_low, y_high = _range((y for line in drawn for _, y in line.points), 0.05)
    integer_x = all(float(x).is_integer() for x in xs)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def sx(x: float) -> float:
        return LEFT + (x - x_low) / (x_high - x_low) * plot_w

    def sy(y: float) -> float:
        return TOP + (y_high - y) / (y_high - y_low) * plot_h

    parts = [head, f"<title>{html.escape(metric)}</title>"]
    faint = 'stroke="currentColor" stroke-opacity="0.12"'
    label = 'font-size="10" fill="currentColor" fill-opacity="0.7"'
    y_ticks = nice_ticks(y_low, y_high, 5)
    y_step = y_ticks[1] - y_ticks[0] if len(y_ticks) > 1 else abs(y_ticks[0]) or 1.0
    for tick in y_ticks:
        y = sy(tick)
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" {faint}/>')
        parts.append(
            f'<text x="{LEFT - 4}" y="{y + 3:.1f}" text-anchor="end" {label}>'
            f"{_tick_label(tick, y_step)}</text>"
        )
    x_ticks = nice_ticks(x_low, x_high, 5, integer=integer_x) if len(xs) > 1 else [*xs]
    x_step = x_ticks[1] - x_ticks[0] if len(x_ticks) > 1 else 1.0
    for tick in x_ticks:
        x = sx(tick)
        parts.append(
            f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + 14}" text-anchor="middle" {label}>'
            f"{_tick_label(tick, x_step)}</text>"
        )
    parts.append(
        f'<text class="nb-accel-x-label" x="{LEFT + plot_w / 2:.1f}" y="{HEIGHT - 3}" '
        f'text-anchor="middle" {label}>{X_LABEL}</text>'
    )
    axis = 'stroke="currentColor" stroke-opacity="0.45"'
    bottom = HEIGHT - BOTTOM
    parts.append(f'<path d="M{LEFT},{TOP}V{bottom}H{WIDTH - RIGHT}" fill="none" {axis}/>')
    for line in drawn:
        points = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in downsample(line.points))
        last_x, last_y = line.points[-1]
        name = html.escape(line.label)
        parts.append(
            f'<polyline points="{points}" fill="none" stroke="{line.color}" stroke-width="1.5" '
            f'stroke-linejoin="round" stroke-linecap="round" data-label="{name}">'
            f"<title>{name}</title></polyline>"
        )
        parts.append(
            f'<circle cx="{sx(last_x):.1f}" cy="{sy(last_y):.1f}" r="2.5" fill="{line.color}"/>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _legend(lines: Sequence[Line]) -> str:
    entries = []
    for line in lines:
        swatch = (
            f'<span style="display:inline-block;width:12px;height:3px;background:{line.color};'
            'vertical-align:middle;margin-right:4px"></span>'
        )
        entries.append(
            f'<span style="white-space:nowrap;margin-right:12px">{swatch}'
            f"{html.escape(line.label)} <b>{html.escape(format_value(line.latest))}</b></span>"
        )
    return f'<div style="line-height:1.5">{"".join(entries)}</div>'


def series_json(series: dict[str, list[Point]]) -> str:
    """The series as JSON that is safe inside a ``<script>`` element."""
    text = json.dumps({label: [list(p) for p in points] for label, points in series.items()})
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def render_charts(lines: Sequence[Line]) -> str:
    """The chart's HTML: one SVG chart with a legend per metric, and the series as JSON."""
    by_metric: dict[str, list[Line]] = {}
    for line in lines:
        by_metric.setdefault(line.metric, []).append(line)
    panels = "".join(
        f'<div class="nb-accel-panel" style="width:{WIDTH}px;font-size:12px">'
        f"{_legend(group)}{_svg(metric, group)}</div>"
        for metric, group in by_metric.items()
    )
    series = {line.label: line.points for line in lines}
    return (
        '<div class="nb-accel-metrics" style="display:flex;flex-wrap:wrap;gap:8px 24px;'
        f'margin-top:6px;line-height:normal">{panels}</div>'
        f'<script type="application/json" class="{SERIES_CLASS}">{series_json(series)}</script>'
    )


_SERIES_RE = re.compile(
    rf'<script type="application/json" class="{SERIES_CLASS}">(.*?)</script>', re.DOTALL
)


def parse_series(value: str) -> dict[str, list[Point]]:
    """Read the series back from the chart's HTML (e.g. from a saved notebook's widget state)."""
    found = _SERIES_RE.search(value)
    if found is None:
        return {}
    data = json.loads(found.group(1))
    return {label: [(x, y) for x, y in points] for label, points in data.items()}


class MetricsChart:
    """Collects the logged metrics and draws them in :attr:`widget` (an ``ipywidgets.HTML``).

    Only rank 0's metrics are kept unless ``all_ranks``; then each (metric, rank) is its own series,
    labelled ``"loss (rank 1)"``. A point's x is its step, or when it has none, the number of
    points the rank logged before it. Non-finite values are left out of the series (the legend
    still shows them as the latest value). While points keep arriving the chart is redrawn at most
    every ``draw_interval_s`` seconds of ``clock``; :meth:`draw` with ``force`` draws what is left.
    """

    def __init__(
        self,
        all_ranks: bool,
        clock: Callable[[], float],
        draw_interval_s: float = DRAW_INTERVAL_S,
    ) -> None:
        """An empty chart (its widget's value is empty until the first draw)."""
        self.all_ranks = all_ranks
        self.widget = ipywidgets.HTML(value="", layout=ipywidgets.Layout(width="100%"))
        #: Every series, by label: ``[(x, y), ...]`` with finite values only.
        self.series: dict[str, list[Point]] = {}
        self._lines: dict[str, Line] = {}
        self._metrics: list[str] = []
        self._counts: dict[int, int] = {}
        self._clock = clock
        self._interval = draw_interval_s
        self._drawn_at: float | None = None
        self._pending = False

    @property
    def pending(self) -> bool:
        """Whether points arrived since the last draw."""
        return self._pending

    def add(self, rank: int, points: Iterable[MetricPoint]) -> bool:
        """Add a rank's points; returns whether any was kept."""
        if not self.all_ranks and rank != 0:
            return False
        kept = False
        for step, values in points:
            count = self._counts.get(rank, 0)
            self._counts[rank] = count + 1
            x = step if step is not None else count
            for name, raw in values.items():
                try:
                    y = float(raw)
                except (TypeError, ValueError):
                    continue
                line = self._line(str(name), rank)
                line.latest = y
                if math.isfinite(y):
                    line.points.append((x, y))
                kept = True
        self._pending = self._pending or kept
        return kept

    def _line(self, metric: str, rank: int) -> Line:
        label = f"{metric} (rank {rank})" if self.all_ranks else metric
        line = self._lines.get(label)
        if line is None:
            if metric not in self._metrics:
                self._metrics.append(metric)
            index = rank if self.all_ranks else self._metrics.index(metric)
            line = Line(metric, rank, label, PALETTE[index % len(PALETTE)])
            self._lines[label] = line
            self.series[label] = line.points
        return line

    def draw(self, force: bool = False) -> bool:
        """Redraw if points arrived (and, unless ``force``, the last draw is old enough)."""
        if not self._pending:
            return False
        now = self._clock()
        if not force and self._drawn_at is not None and now - self._drawn_at < self._interval:
            return False
        self._drawn_at, self._pending = now, False
        order = {metric: i for i, metric in enumerate(self._metrics)}
        lines = sorted(self._lines.values(), key=lambda line: (order[line.metric], line.rank))
        value = render_charts(lines)
        if self.widget.value != value:
            self.widget.value = value
        return True
