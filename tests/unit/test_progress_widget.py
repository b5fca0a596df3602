"""The notebook progress widget, built in-process and fed launch events (no kernel, no browser)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import ipywidgets
import pytest
import traitlets

from nb_accel._messages import BarState, MetricPoint, Report
from nb_accel.launch.failures.verdict import rank_list
from nb_accel.launch.views.view import LaunchView
from nb_accel.notebook.compat_widgets import text_color, text_of, tooltip_of
from nb_accel.notebook.metrics_chart import (
    BOTTOM,
    HEIGHT,
    MAX_DRAWN_POINTS,
    SERIES_CLASS,
    TOP,
    WIDTH,
    downsample,
    nice_ticks,
    parse_series,
)
from nb_accel.notebook.progress_widget import (
    COLLAPSED_ROWS,
    MAX_KEPT_CLOSED,
    REST_INTERVAL_S,
    ProgressWidget,
)


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def bar(
    bar_id: int = 0,
    n: float = 37,
    total: float | None = 100,
    level: int = 0,
    desc: str = "epoch",
    closed: bool = False,
    leave: bool = True,
    rate: float | None = 11.23,
    postfix: str = "loss=0.512",
) -> BarState:
    return BarState(
        bar=bar_id,
        level=level,
        desc=desc,
        n=n,
        total=total,
        unit="it",
        elapsed=3.2,
        rate=rate,
        postfix=postfix,
        closed=closed,
        leave=leave,
    )


def report(
    rank: int, *bars: BarState, metrics: tuple[MetricPoint, ...] = (), time: float = 0.0
) -> Report:
    return Report(rank=rank, bars=bars, metrics=metrics, time=time)


def make(world_size: int = 2, **kwargs: Any) -> tuple[ProgressWidget, Clock]:
    clock = Clock()
    view = ProgressWidget(
        "Launching 2 processes on CPU (gloo; fork)", world_size, clock=clock, **kwargs
    )
    for rank in range(world_size):
        view.started(rank, 100 + rank)
    return view, clock


def polylines(value: str) -> list[list[tuple[float, float]]]:
    found = re.findall(r'<polyline points="([^"]*)"', value)
    return [[tuple(map(float, p.split(","))) for p in points.split()] for points in found]  # type: ignore[misc]


def test_it_is_a_launch_view_with_a_row_per_rank() -> None:
    view = ProgressWidget("Launching 3 processes", 3, clock=Clock())
    _: LaunchView = view
    assert isinstance(view.widget, ipywidgets.VBox)
    assert [row.rank for row in view.rows] == [0, 1, 2]
    assert all(text_of(row.note) == "starting…" and row.bar.value == 0 for row in view.rows)
    assert "Launching 3 processes" in view.header.value and "running" in view.header.value
    view.started(1, 4242)
    assert text_of(view.rows[1].note) == "running (pid 4242)"
    assert text_of(view.rows[0].note) == "starting…"


def test_bars_progress_and_finish_green() -> None:
    view, clock = make()
    view.report(report(0, bar(n=37, total=100)))
    view.report(report(1, bar(n=10, total=100)))
    row = view.rows[0]
    assert (row.bar.max, row.bar.value, row.bar.bar_style) == (100, 37, "")
    assert row.desc.value == "epoch" and row.pct.value == "37%"
    assert row.text.value == "37/100 [00:03<00:05, 11.23it/s, loss=0.512]"
    assert text_of(row.note) == ""
    clock.now += 12.34
    view.finished(True)
    assert all(r.bar.bar_style == "success" for r in view.rows)
    assert view.rows[1].bar.value == 10  # the bar keeps where it got to
    assert "done in 12.3 s" in view.header.value
    assert view.status == "done"


def test_unknown_total_shows_a_full_info_bar() -> None:
    view, _ = make()
    view.report(report(0, bar(n=42, total=None)))
    row = view.rows[0]
    assert (row.bar.max, row.bar.value, row.bar.bar_style) == (1, 1, "info")
    assert row.pct.value == ""
    assert row.text.value == "42it [00:03, 11.23it/s, loss=0.512]"  # tqdm's text without a total
    view.finished(True)
    assert row.bar.bar_style == "success"


def test_nested_bars_show_inner_rows_and_drop_closed_transient_ones() -> None:
    view, _ = make()
    view.report(report(0, bar(0, n=1, total=3), bar(1, n=5, total=50, level=1, desc="batch")))
    row = view.rows[0]
    assert row.desc.value == "epoch" and row.bar.max == 3  # the outermost bar is the row's
    assert list(row.subrows) == [1]
    inner = row.subrows[1]
    assert inner.desc.value == "batch" and (inner.bar.value, inner.bar.max) == (5, 50)
    assert row.sub.children == (inner.box,)

    view.report(report(0, bar(1, n=50, total=50, level=1, desc="batch", closed=True, leave=False)))
    assert row.subrows == {} and row.sub.children == ()
    assert inner.box.comm is None  # closed, so the browser drops it too

    view.report(report(0, bar(2, n=50, total=50, level=1, desc="batch", closed=True, leave=True)))
    assert list(row.subrows) == [2] and row.subrows[2].bar.bar_style == "success"
    assert row.desc.value == "epoch"  # still the open outer bar


def test_finished_outer_bar_stays_and_old_kept_bars_are_capped() -> None:
    view, _ = make()
    row = view.rows[0]
    view.report(report(0, bar(0, n=0, total=30)))
    for i in range(1, MAX_KEPT_CLOSED + 6):
        view.report(report(0, bar(i, n=9, total=9, level=1, desc=f"b{i}", closed=True)))
    assert len(row.subrows) == MAX_KEPT_CLOSED
    assert row.subrows[MAX_KEPT_CLOSED + 5].desc.value == f"b{MAX_KEPT_CLOSED + 5}"
    view.report(report(0, bar(0, n=30, total=30, closed=True)))
    assert row.desc.value == "epoch" and row.bar.value == 30 and row.bar.bar_style == "success"


def test_stalled_rank_is_marked_and_cleared_by_a_report() -> None:
    view, clock = make(stall_after_s=30.0)
    view.report(report(0, bar()))
    view.report(report(1, bar()))
    clock.now += 29
    view.tick()
    assert view.rows[0].bar.bar_style == "" and text_of(view.rows[0].note) == ""
    clock.now += 13
    view.report(report(1, bar(n=38)))
    view.tick()
    row = view.rows[0]
    assert row.bar.bar_style == "warning" and text_of(row.note) == "stalled for 42 s"
    assert text_color(row.note) == "#ef6c00"
    assert view.rows[1].bar.bar_style == ""
    assert "1 stalled" in view.header.value
    view.report(report(0, bar(n=38)))
    assert row.bar.bar_style == "" and text_of(row.note) == ""
    assert "stalled" not in view.header.value


def test_a_report_whose_bars_did_not_move_does_not_restart_the_stall_clock() -> None:
    """tqdm's monitor thread redraws a bar every 10 s with the same count: no sign of life."""
    view, clock = make(stall_after_s=30.0)
    view.report(report(0, bar(n=0)))
    view.report(report(1, bar(n=2)))
    for _ in range(4):  # rank 0 moves on; rank 1 only redraws, with a new elapsed time
        clock.now += 10
        view.report(report(0, bar(n=clock.now - 1000)))
        view.report(report(1, replace(bar(n=2), elapsed=clock.now - 1000, rate=None)))
        view.tick()
    stuck, moving = view.rows[1], view.rows[0]
    assert stuck.stalled_for == 40 and text_of(stuck.note) == "stalled for 40 s"
    assert stuck.bar.bar_style == "warning" and "1 stalled" in view.header.value
    assert moving.stalled_for is None and text_of(moving.note) == ""
    view.report(report(1, bar(n=3)))
    assert stuck.stalled_for is None and stuck.bar.bar_style == ""


def test_a_rank_that_returned_is_never_stalled() -> None:
    view, clock = make(stall_after_s=30.0)
    view.report(report(0, bar(n=100, total=100, closed=True)))
    view.returned(0)
    view.report(report(1, bar(n=2)))
    clock.now += 32
    view.tick()
    done, stuck = view.rows
    assert done.stalled_for is None and text_of(done.note) == ""
    assert done.bar.bar_style == "success" and done.status == "done"
    assert text_of(stuck.note) == "stalled for 32 s" and stuck.bar.bar_style == "warning"
    assert "1 stalled" in view.header.value
    view.failed(1, "RuntimeError: stuck")
    view.returned(1)  # a failed rank stays failed
    view.finished(False)
    assert done.bar.bar_style == "success" and text_of(done.note) == ""  # it did finish
    assert text_of(stuck.note) == "failed: RuntimeError: stuck"


def test_a_rank_stopped_after_a_failure_shows_the_reason_and_is_not_stalled() -> None:
    view, clock = make(world_size=3, stall_after_s=30.0)
    for rank in range(3):
        view.report(report(rank, bar(n=5)))
    view.failed(2, "RuntimeError: Connection closed by peer")
    view.failed(1, "ValueError: bad batch")
    view.stopped(2, "rank 1 failed")  # a knock-on failure: the later call wins
    clock.now += 40
    view.tick()
    stopped = view.rows[2]
    assert stopped.status == "stopped" and stopped.stalled_for is None
    assert text_of(stopped.note) == "stopped (rank 1 failed)" and stopped.bar.bar_style == ""
    assert text_color(stopped.note) == "#808080"
    assert text_of(view.rows[0].note) == "stalled for 40 s"
    view.finished(False)
    assert "failed after" in view.header.value and "rank 1 failed" in view.header.value
    assert "rank 2" not in view.header.value
    assert text_of(stopped.note) == "stopped (rank 1 failed)"


def test_no_rank_is_stalled_when_no_rank_reports_or_after_the_end() -> None:
    view, clock = make()
    clock.now += 100
    view.tick()
    assert all(row.stalled_for is None for row in view.rows)  # the function shows no progress
    view.report(report(1, bar()))
    clock.now += 100
    view.finished(True)
    view.tick()
    assert all(row.bar.bar_style == "success" for row in view.rows)


def test_a_silent_rank_among_reporting_ones_is_stalled() -> None:
    view, clock = make()
    clock.now += 35
    view.report(report(1, bar()))
    view.tick()
    row = view.rows[0]
    assert (row.bar.value, row.bar.bar_style) == (1, "warning")
    assert text_of(row.note) == "stalled for 35 s"


def test_failure_marks_the_rank_red_with_the_summary() -> None:
    view, clock = make()
    view.report(report(0, bar()))
    view.report(report(1, bar()))
    view.failed(1, "ValueError: bad batch\nTraceback (most recent call last): ...")
    failed = view.rows[1]
    assert failed.bar.bar_style == "danger"
    assert text_of(failed.note) == "failed: ValueError: bad batch"
    assert text_color(failed.note) == "#d32f2f"
    assert failed.text.value.startswith("37/100")  # where it stopped stays visible
    clock.now += 2
    view.finished(False)
    assert failed.bar.bar_style == "danger"
    assert text_of(view.rows[0].note) == "stopped" and view.rows[0].bar.bar_style != "success"
    assert view.rows[0].bar.value == 37
    assert "failed after 2.0 s" in view.header.value and "rank 1 failed" in view.header.value


def test_interrupted_launch_is_stopped() -> None:
    view, _ = make()
    view.report(report(0, bar()))
    view.finished(False)
    assert view.status == "stopped" and "stopped after" in view.header.value
    assert [text_of(row.note) for row in view.rows] == ["stopped", "stopped"]


def test_metrics_series_accumulate_with_and_without_steps() -> None:
    view, _ = make()
    view.report(report(0, metrics=((10, {"loss": 1.5, "acc": 0.1}), (20, {"loss": 1.2}))))
    view.report(report(0, metrics=((None, {"lr": 0.1}), (None, {"lr": 0.05}))))
    view.report(report(1, metrics=((10, {"loss": 9.0}),)))  # only rank 0 by default
    assert view.series == {
        "loss": [(10, 1.5), (20, 1.2)],
        "acc": [(10, 0.1)],
        "lr": [(2, 0.1), (3, 0.05)],  # x counts the rank's points
    }


def test_all_ranks_metrics_are_labelled_by_rank() -> None:
    view, _ = make(all_ranks_metrics=True)
    view.report(report(0, metrics=((0, {"loss": 1.0}),)))
    view.report(report(1, metrics=((0, {"loss": 2.0}), (1, {"loss": 1.5}))))
    view.finished(True)  # draws what arrived since the last draw
    assert view.series == {"loss (rank 0)": [(0, 1.0)], "loss (rank 1)": [(0, 2.0), (1, 1.5)]}
    value = view.chart.widget.value
    assert value.count('<svg xmlns="http://www.w3.org/2000/svg"') == 1  # one chart per metric
    assert len(polylines(value)) == 2 and "loss (rank 1) <b>1.5</b>" in value


def test_chart_html_embeds_the_series_and_a_line_per_series() -> None:
    view, _ = make()
    assert view.chart.widget not in view.widget.children  # no chart before any metric
    view.report(report(0, metrics=((0, {"loss": 1.5, "acc": 0.5}), (1, {"loss": 1.2, "acc": 0.6}))))
    assert view.chart.widget in view.widget.children
    value = view.chart.widget.value
    found = re.search(
        rf'<script type="application/json" class="{SERIES_CLASS}">(.*?)</script>', value
    )
    assert found is not None
    assert json.loads(found.group(1)) == {"loss": [[0, 1.5], [1, 1.2]], "acc": [[0, 0.5], [1, 0.6]]}
    assert parse_series(value) == view.series
    assert len(polylines(value)) == 2 and value.count("<svg") == 2
    assert "loss <b>1.2</b>" in value and "acc <b>0.6</b>" in value  # legend: latest values
    assert len(set(re.findall(r'stroke="(#[0-9a-f]{6})"', value))) == 2  # distinct colours


def test_each_chart_names_its_x_axis_step_below_the_tick_labels() -> None:
    view, _ = make()
    view.report(report(0, metrics=((0, {"loss": 1.5, "acc": 0.5}), (10, {"loss": 1.2}))))
    value = view.chart.widget.value
    label = r'<text class="nb-accel-x-label"[^>]*\by="([\d.]+)"[^>]*>([^<]*)</text>'
    names = re.findall(label, value)
    assert [name for _, name in names] == ["step", "step"]  # one per chart
    ticks = re.findall(r'<text x="[\d.]+" y="([\d.]+)" text-anchor="middle"[^>]*>10</text>', value)
    assert ticks and all(float(y) < float(names[0][0]) <= HEIGHT for y in ticks)


def test_series_json_is_escaped_inside_the_script_element() -> None:
    view, _ = make()
    view.report(report(0, metrics=((0, {"</script><b>x&y": 1.0}),)))
    value = view.chart.widget.value
    assert value.count("</script>") == 1
    assert parse_series(value) == {"</script><b>x&y": [(0, 1.0)]}


def test_non_finite_values_are_left_out_of_the_series() -> None:
    view, _ = make()
    nan, inf = math.nan, math.inf
    view.report(report(0, metrics=((0, {"loss": 2.0}), (1, {"loss": nan}), (2, {"loss": inf}))))
    view.report(report(0, metrics=((3, {"loss": 1.0}), (4, {"loss": nan}))))
    view.finished(True)
    assert view.series == {"loss": [(0, 2.0), (3, 1.0)]}
    value = view.chart.widget.value

    def refuse(token: str) -> None:
        raise AssertionError(f"non-finite {token} in the JSON")

    found = re.search(rf'class="{SERIES_CLASS}">(.*?)</script>', value)
    assert found is not None
    json.loads(found.group(1), parse_constant=refuse)
    assert "loss <b>nan</b>" in value  # the legend says what the latest value was
    assert "inf" not in value.split("<svg", 1)[1]
    (line,) = polylines(value)
    assert all(math.isfinite(c) for point in line for c in point)


def test_single_and_constant_points_get_a_sensible_range() -> None:
    view, _ = make()
    view.report(report(0, metrics=((5, {"one": 3.0, "flat": 2.0}), (6, {"flat": 2.0}))))
    value = view.chart.widget.value
    for line in polylines(value):
        for x, y in line:
            assert 0 <= x <= WIDTH and TOP <= y <= HEIGHT - BOTTOM
    ys = {y for line in polylines(value) for _, y in line}
    assert ys == {TOP + (HEIGHT - TOP - BOTTOM) / 2}  # mid-height, not on an edge
    assert nice_ticks(0.0, 1.0, 5) == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    assert nice_ticks(0.0, 999.0, 5, integer=True) == [0, 200, 400, 600, 800]
    assert nice_ticks(0.0, 3.0, 5, integer=True) == [0, 1, 2, 3]
    assert nice_ticks(2.0, 2.0) == [2.0]


def test_ten_thousand_points_are_downsampled_for_drawing_only() -> None:
    view, _ = make()
    points = [(i, {"loss": 1.0 / (1 + i) + (5.0 if i == 7777 else 0.0)}) for i in range(10_000)]
    view.report(report(0, metrics=tuple(points)))  # type: ignore[arg-type]
    value = view.chart.widget.value
    assert len(view.series["loss"]) == 10_000
    assert len(parse_series(value)["loss"]) == 10_000
    (line,) = polylines(value)
    assert len(line) <= MAX_DRAWN_POINTS
    kept = downsample(view.series["loss"])
    assert len(kept) <= MAX_DRAWN_POINTS and (7777, 5.0 + 1.0 / 7778) in kept  # the spike stays
    assert kept[0] == (0, 1.0) and kept[-1] == view.series["loss"][-1]
    top = TOP + (HEIGHT - TOP - BOTTOM) * 0.05 / 1.1  # the plot's top, less the 5% margin
    assert min(y for _, y in line) == pytest.approx(top, abs=0.1)  # the spike is drawn


def test_chart_redraws_only_when_points_arrived_and_at_most_once_a_second() -> None:
    view, clock = make()
    draws: list[str] = []
    view.chart.widget.observe(lambda change: draws.append(change["new"]), names="value")
    view.report(report(0, metrics=((0, {"loss": 1.0}),)))
    assert len(draws) == 1  # the first points are drawn at once
    clock.now += 0.5
    view.report(report(0, metrics=((1, {"loss": 0.9}),)))
    view.report(report(0, bar()))  # no metrics
    assert len(draws) == 1
    clock.now += 0.6
    view.tick()
    assert len(draws) == 2 and parse_series(draws[-1])["loss"] == [(0, 1.0), (1, 0.9)]
    clock.now += 5
    view.tick()
    assert len(draws) == 2  # nothing new
    view.report(report(0, metrics=((2, {"loss": 0.8}),)))
    clock.now += 0.1
    view.report(report(0, metrics=((3, {"loss": 0.7}),)))
    view.finished(True)
    assert len(draws) == 4 and len(parse_series(draws[-1])["loss"]) == 4


def _widgets(root: Any) -> Iterator[Any]:
    yield root
    for name in ("layout", "style"):
        sub = getattr(root, name, None)
        if isinstance(sub, ipywidgets.Widget):
            yield sub
    for child in getattr(root, "children", ()):
        yield from _widgets(child)


@pytest.fixture
def trait_sets(monkeypatch: pytest.MonkeyPatch) -> list[tuple[object, str]]:
    """Every trait set (changed or not) on a widget, as (widget, trait name)."""
    sets: list[tuple[object, str]] = []
    original = traitlets.TraitType.set

    def spy(self: traitlets.TraitType[Any, Any], obj: Any, value: Any) -> None:
        if isinstance(obj, ipywidgets.Widget):
            sets.append((obj, str(self.name)))
        original(self, obj, value)

    monkeypatch.setattr(traitlets.TraitType, "set", spy)
    return sets


def test_nothing_is_sent_when_nothing_changed(trait_sets: list[tuple[object, str]]) -> None:
    view, clock = make(all_ranks_metrics=True)
    nested = (bar(0, n=1, total=3), bar(1, n=5, total=None, level=1, desc="batch"))
    view.report(report(0, *nested, metrics=((0, {"loss": 1.0}),)))
    view.report(report(1, bar()))
    clock.now += 31
    view.tick()  # rank 0 and rank 1 stalled
    changes: list[str] = []
    for widget in _widgets(view.widget):
        widget.observe(lambda change: changes.append(change["name"]), names=traitlets.All)
    trait_sets.clear()
    view.report(report(1, bar()))  # the same count: still stalled, and nothing to send
    view.tick()
    assert trait_sets == [] and changes == []
    view.report(report(1, bar(n=38)))
    trait_sets.clear()
    changes.clear()
    view.report(report(1, bar(n=38)))
    view.report(report(1, bar(n=38)))
    view.tick()
    view.tick()
    sent = [name for widget, name in trait_sets if not name.startswith("_")]
    assert sent == [] and changes == []


def test_a_progress_step_sets_only_what_changed(trait_sets: list[tuple[object, str]]) -> None:
    view, _ = make()
    view.report(report(0, bar(n=37)))
    trait_sets.clear()
    view.report(report(0, bar(n=38)))
    row = view.rows[0]
    changed = {(id(widget), name) for widget, name in trait_sets}
    assert changed == {(id(row.bar), "value"), (id(row.pct), "value"), (id(row.text), "value")}
    assert len(trait_sets) == 3


def many(world_size: int, **kwargs: Any) -> tuple[ProgressWidget, Clock]:
    """A launch of ``world_size`` ranks; rank r is at 40 + r % 6 of 100, with an inner bar."""
    view, clock = make(world_size, **kwargs)
    for rank in range(world_size):
        epoch = bar(0, n=40 + rank % 6, total=100)
        view.report(report(rank, epoch, bar(1, n=rank, total=500, level=1, desc="batch")))
    clock.now += 1
    view.tick()
    return view, clock


def shown(view: ProgressWidget) -> list[int]:
    return [int(text_of(row.label).split()[1]) for row in view.rows]


def visible_widgets(view: ProgressWidget) -> int:
    return sum(1 for _ in _widgets(view.widget))


def test_up_to_eight_ranks_each_has_a_compact_row_naming_its_inner_bars() -> None:
    view, _ = many(8)
    assert shown(view) == list(range(8)) and view.rest is None
    row = view.rows[3]
    assert row.sub not in row.box.children and row.subrows == {}  # one line per rank
    assert row.text.value == "43/100 [00:03<00:05, 11.23it/s, loss=0.512] · batch 3/500"
    few, _ = many(4)
    assert list(few.rows[3].subrows) == [1]  # up to four ranks: inner bars below the row


@pytest.mark.parametrize("world_size", [16, 64])
def test_many_ranks_show_a_bounded_number_of_rows_and_one_line_for_the_rest(
    world_size: int,
) -> None:
    view, _ = many(world_size)
    assert len(view.rows) == COLLAPSED_ROWS
    assert len(view._rows_box.children) == COLLAPSED_ROWS + 1
    assert visible_widgets(view) == visible_widgets(many(16)[0])  # the same with 64 ranks
    slowest = sorted(range(world_size), key=lambda r: (r % 6, r))[:COLLAPSED_ROWS]
    assert shown(view) == sorted(slowest)  # the least advanced, the lower ranks first
    rest = view.rest
    assert rest is not None
    hidden = world_size - COLLAPSED_ROWS
    assert text_of(rest.label) == f"{hidden} more"
    low = min(40 + r % 6 for r in range(world_size) if r not in slowest)
    assert rest.line.text.value.startswith(f"{low}-45/100, median ")
    assert rest.line.desc.value == "epoch" and rest.line.bar.max == 100
    assert text_of(rest.note) == ""


def test_the_slowest_ranks_get_the_rows_and_change_as_they_move() -> None:
    view, clock = many(64)
    for rank in (17, 42, 63):
        view.report(report(rank, bar(0, n=3, total=100)))
    clock.now += 1
    view.tick()
    assert {17, 42, 63} <= set(shown(view))
    assert view.row_for(42) is not None and view.row_for(42).pct.value == "3%"  # type: ignore[union-attr]
    assert shown(view) == sorted(shown(view))  # in rank order
    view.report(report(42, bar(0, n=99, total=100)))
    clock.now += 1
    view.tick()
    assert 42 not in shown(view) and view.row_for(42) is None
    assert "-99/100" in view.rest.line.text.value  # type: ignore[union-attr]


def test_failed_stalled_and_stopped_ranks_are_always_in_sight() -> None:
    view, clock = many(64, stall_after_s=30.0)
    clock.now += 20
    for rank in range(64):
        if rank not in (5, 33):
            view.report(report(rank, bar(0, n=60, total=100)))
    view.failed(50, "ValueError: bad batch")
    view.stopped(51, "rank 50 failed")
    clock.now += 15
    view.tick()  # ranks 5 and 33 have not moved for 36 s
    rows = {int(text_of(row.label).split()[1]): row for row in view.rows}
    assert {5, 33, 50, 51} <= set(rows)
    assert text_of(rows[50].note) == "failed: ValueError: bad batch"
    assert text_of(rows[5].note) == text_of(rows[33].note) == "stalled for 36 s"
    assert text_of(rows[51].note) == "stopped (rank 50 failed)"
    assert "2 stalled" in view.header.value and "rank 50 failed" in view.header.value
    for rank in range(52, 64):  # more ranks to look at than rows: the rest line names them
        view.stopped(rank, "rank 50 failed")
    rest = view.rest
    assert rest is not None
    assert {5, 33, 50} <= set(shown(view))
    hidden = [r for r in range(51, 64) if r not in shown(view)]
    assert len(hidden) == 13 - (COLLAPSED_ROWS - 3)
    assert text_of(rest.note) == f"stopped: {rank_list(hidden)} (rank 50 failed)"
    assert rest.line.bar.bar_style == ""


def test_a_report_of_a_rank_without_a_row_sends_nothing_until_the_summary_is_due(
    trait_sets: list[tuple[object, str]],
) -> None:
    view, clock = many(64)
    hidden = [r for r in range(64) if view.row_for(r) is None]
    trait_sets.clear()
    for step in range(10):
        for rank in hidden:
            view.report(report(rank, bar(0, n=46 + step, total=100)))
    assert trait_sets == []  # the summary line waits for its turn
    clock.now += REST_INTERVAL_S
    view.report(report(hidden[0], bar(0, n=57, total=100)))
    rest = view.rest
    assert rest is not None and rest.line.text.value == "55-57/100, median 55"
    sent = {"value", "max", "bar_style", "tooltip", "_dom_classes"}
    assert {name for _, name in trait_sets} <= sent
    trait_sets.clear()
    row = view.rows[0]
    view.report(report(row.state.rank, bar(0, n=41, total=100)))
    assert {id(widget) for widget, _ in trait_sets} <= {id(row.bar), id(row.pct), id(row.text)}


def test_rank_lists_join_runs() -> None:
    assert rank_list([3]) == "rank 3"
    assert rank_list([9, 0, 2, 3, 4, 5]) == "ranks 0, 2-5, 9"
    assert rank_list([1, 2]) == "ranks 1, 2"


def test_rows_of_a_launch_across_hosts_are_grouped_under_each_host() -> None:
    view = ProgressWidget("t", 4, hosts=["node0", "node0", "node1", "node1"])
    children = view._rows_box.children
    headers = [c.value for c in children if isinstance(c, ipywidgets.HTML)]
    assert len(children) == 6 and len(headers) == 2, children
    assert "node0" in headers[0] and "ranks 0, 1" in headers[0], headers
    assert "node1" in headers[1] and "ranks 2, 3" in headers[1], headers
    assert children[2] is view.rows[1].box and children[3].value == headers[1]  # in rank order
    assert [tooltip_of(row.label) for row in view.rows] == ["node0", "node0", "node1", "node1"]


def test_rows_of_one_machine_have_no_host_lines() -> None:
    for hosts in (None, ["node0", "node0"]):
        view = ProgressWidget("t", 2, hosts=hosts)
        assert list(view._rows_box.children) == [row.box for row in view.rows]


def test_a_restart_says_why_and_every_rank_starts_again() -> None:
    view, _ = make()
    view.report(report(0, bar(n=37, total=100)))
    view.failed(1, "worker for rank 1 (pid 101) was killed by SIGKILL")
    view.stopped(0, "rank 1 failed")
    view.restarted("restart 1 of 2 after rank 1 was killed by SIGKILL")
    assert "restart 1 of 2 after rank 1 was killed by SIGKILL" in view.notes.value
    assert view.notes in view.widget.children
    assert all(text_of(row.note) == "starting…" and row.bar.value == 0 for row in view.rows)
    assert "failed" not in view.header.value and "running" in view.header.value
    view.started(1, 202)
    assert text_of(view.rows[1].note) == "running (pid 202)"
    view.finished(True)
    assert view.status == "done"
