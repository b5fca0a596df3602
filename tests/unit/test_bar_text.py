"""A bar's text in the kernel is the text tqdm itself writes for the same bar: real tqdm bars are
driven on a hand-moved clock, their state is taken as a worker takes it (``bar_state``), and
the text view's line and the widget row's texts are compared with tqdm's own output."""

from __future__ import annotations

import html
import io
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
import tqdm
import tqdm.notebook
import tqdm.std

from nb_accel._messages import BarState, Report, decode, encode
from nb_accel.launch.views.text_view import BAR_WIDTH, TextView
from nb_accel.notebook.progress_widget import ProgressWidget
from nb_accel.notebook.rank_row import RankState
from nb_accel.notebook.rank_summary import summarize_rest
from nb_accel.worker.reporting.progress import Discard, bar_state

pytestmark = pytest.mark.timeout(60)

MiB = 2**20
format_meter = tqdm.std.tqdm.format_meter
#: The right side of a bar format of a user's own.
COUNTS = "{n_fmt} of {total_fmt} [{rate_fmt}{postfix}]"


class Clock:
    """tqdm's clock, moved by hand so that two readings of a bar agree."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(tqdm.std, "time", clock)  # what a bar made from now on reads
    monkeypatch.setattr(tqdm.std.tqdm, "monitor_interval", 0)  # no monitor thread
    return clock


@dataclass(frozen=True)
class Case:
    """A bar: its arguments, the updates it gets half a second apart, and what follows."""

    kwargs: dict[str, Any]
    steps: tuple[float, ...] = (1,) * 30
    then: Callable[[Any], None] = field(default=lambda bar: None)


def closing(bar: Any) -> None:
    bar.close()


CASES = {
    "download": Case(dict(total=50 * MiB, unit="B", unit_scale=True, desc="download"), (MiB,) * 10),
    "download in KiB": Case(
        dict(total=50 * MiB, unit="B", unit_scale=True, unit_divisor=1024, desc="get"), (MiB,) * 10
    ),
    "bar format": Case(
        dict(total=100, desc="train", bar_format=f"{{desc}} {{percentage:.1f}}%|{{bar}}| {COUNTS}"),
    ),
    "bar format without a bar": Case(
        dict(total=100, bar_format="{desc}: {n_fmt}/{total_fmt} after {elapsed}", desc="x"),
    ),
    "postfix": Case(
        dict(total=100, desc="epoch"), then=lambda bar: bar.set_postfix(loss=0.5, lr=1e-4)
    ),
    "no total": Case(dict(desc="stream", unit="img"), (4,) * 12),
    "no total, no description": Case(dict(), (1,) * 3),
    "closed": Case(dict(total=30, desc="epoch"), then=closing),
    "closed early": Case(dict(total=100, desc="epoch"), (5, 1, 1, 20), then=closing),
    "initial": Case(dict(total=100, initial=40, desc="resumed"), (2,) * 10),
    "closed after resuming": Case(dict(total=100, initial=40, desc="resumed"), then=closing),
    "slow": Case(dict(total=10, desc="slow"), (0, 0, 1)),
    "overrun": Case(dict(total=10, desc="over"), (1,) * 12),
    "scaled by a number": Case(dict(total=100, unit_scale=4, desc="x4"), (5,) * 6),
}


def drive(clock: Clock, case: Case, make: Callable[..., Any] = tqdm.tqdm) -> Any:
    """A real bar (drawing into a string), updated as ``case`` says."""
    bar = make(file=io.StringIO(), mininterval=0, **case.kwargs)
    for step in case.steps:
        clock.now += 0.5
        bar.update(step)
    clock.now += 0.25
    bar.refresh()
    case.then(bar)
    return bar


def reported(bar: Any) -> BarState:
    """The bar's state as its worker reports it (after the event channel's round trip)."""
    state = bar_state(bar, 0, closed=bar.disable)
    event = decode(encode(Report(rank=0, bars=(state,), metrics=(), time=0.0)))
    assert isinstance(event, Report)
    return event.bars[0]


def drawn_by_tqdm(bar: Any) -> str:
    """The last line tqdm drew in the bar's file."""
    return str(bar.fp.getvalue()).rstrip("\n").split("\r")[-1].rstrip()


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def text_view_line(state: BarState, tty: bool, metrics: dict[str, float] | None = None) -> str:
    stream = Terminal() if tty else io.StringIO()
    view = TextView(1, stream=stream, stall_after_s=60.0)
    view.report(Report(rank=0, bars=(state,), metrics=((None, metrics or {}),), time=0.0))
    view.finished(True)
    return stream.getvalue().strip("\n").split("\r")[-1].split("\n")[-1].rstrip()


@pytest.mark.parametrize("name", CASES)
def test_the_text_view_writes_the_line_tqdm_draws(clock: Clock, name: str) -> None:
    bar = drive(clock, CASES[name])
    state = reported(bar)
    assert text_view_line(state, tty=False) == format_meter(**bar.format_dict)
    assert text_view_line(state, tty=False) == drawn_by_tqdm(bar)
    wide = format_meter(**{**bar.format_dict, "ncols": BAR_WIDTH})
    assert text_view_line(state, tty=True) == wide.rstrip()


def test_the_download_bar_is_written_in_scaled_units(clock: Clock) -> None:
    line = text_view_line(reported(drive(clock, CASES["download"])), tty=False)
    assert re.fullmatch(r"download:  20%\|#+ +\| 10\.5M/52\.4M \[00:05<00:20, 2\.10MB/s\]", line)
    line = text_view_line(reported(drive(clock, CASES["download in KiB"])), tty=False)
    assert line.endswith("| 10.0M/50.0M [00:05<00:20, 2.10MB/s]")  # rates: in 1000s


def test_metrics_follow_the_bar_s_postfix(clock: Clock) -> None:
    bar = drive(clock, CASES["postfix"])
    line = text_view_line(reported(bar), tty=False, metrics={"acc": 0.25})
    postfix = "loss=0.5, lr=0.0001, acc=0.25"
    assert line == format_meter(**{**bar.format_dict, "postfix": postfix})


def tqdm_widget_texts(bar: Any) -> tuple[str, str, str]:
    """What tqdm writes around a widget's bar: ``(before, percentage, after)``. With the bar's
    own ``bar_format`` it is split as ``tqdm.notebook`` splits it; with tqdm's default the
    description and percentage of its ``l_bar`` and its ``r_bar`` (without a total: tqdm's
    count and rate, without the description)."""
    info = bar.format_dict
    if info["bar_format"]:
        text = format_meter(**{**info, "bar_format": info["bar_format"].replace("{bar}", "<bar/>")})
        if "<bar/>" not in text:
            return "", "", text
        before, after = re.split(r"\|?<bar/>\|?", text, maxsplit=1)
        return before, "", after
    if not info["total"] or info["n"] >= info["total"] + 0.5:
        return info["prefix"], "", format_meter(**{**info, "prefix": ""})
    l_bar = format_meter(**{**info, "bar_format": "{l_bar}"})
    r_bar = format_meter(**{**info, "bar_format": "{r_bar}"})
    percentage = l_bar.removeprefix(f"{info['prefix']}: " if info["prefix"] else "")
    return info["prefix"], percentage.rstrip("|").strip(), r_bar.removeprefix("| ")


def widget_row(state: BarState) -> tuple[str, str, str]:
    view = ProgressWidget("a launch", 1, clock=Clock())
    view.started(0, 100)
    view.report(Report(rank=0, bars=(state,), metrics=(), time=0.0))
    row = view.rows[0]
    return row.desc.value, row.pct.value, row.text.value


@pytest.mark.parametrize("name", CASES)
def test_a_widget_row_shows_tqdm_s_text_beside_its_bar(clock: Clock, name: str) -> None:
    bar = drive(clock, CASES[name])
    assert widget_row(reported(bar)) == tqdm_widget_texts(bar)


def test_a_widget_row_shows_the_download_in_scaled_units(clock: Clock) -> None:
    texts = widget_row(reported(drive(clock, CASES["download in KiB"])))
    assert texts == ("get", "20%", "10.0M/50.0M [00:05<00:20, 2.10MB/s]")
    texts = widget_row(reported(drive(clock, CASES["no total, no description"])))
    assert texts == ("", "", "3it [00:01,  2.00it/s]")


@pytest.mark.parametrize("name", ["bar format", "bar format without a bar"])
def test_a_bar_format_is_split_around_the_bar_as_tqdm_notebook_shows_it(
    clock: Clock, name: str
) -> None:
    bar = drive(clock, CASES[name], make=lambda **kw: tqdm.notebook.tqdm(display=False, **kw))
    before, _, after = bar.container.children

    def shown(value: str) -> str:
        return html.unescape(value).replace("\u2007", " ")

    desc, percentage, text = widget_row(reported(bar))
    assert (desc, percentage, text) == (shown(before.value), "", shown(after.value))
    assert text  # the text is not left out


def test_a_compact_row_names_its_inner_bars_count_as_tqdm_writes_it(clock: Clock) -> None:
    outer = drive(clock, Case(dict(total=3, desc="files"), (1,)))
    inner = drive(clock, CASES["download"])
    view = ProgressWidget("a launch", 6, clock=Clock())  # one compact row per rank
    view.report(
        Report(rank=0, bars=(reported(outer), bar_state(inner, 1, False)), metrics=(), time=0)
    )
    counts = format_meter(**{**inner.format_dict, "bar_format": "{n_fmt}/{total_fmt}"})
    assert counts == "10.5M/52.4M"
    assert view.rows[0].text.value.endswith(f" · download {counts}")


def test_the_line_for_many_ranks_writes_counts_in_the_bars_units() -> None:
    states = []
    for rank in range(10):
        state = RankState(rank)
        count = (10 + rank) * MiB
        bar = BarState(0, 0, "get", count, 50 * MiB, "B", 5.0, None, "", unit_scale=True)
        state.update([replace(bar, unit_divisor=1024)])
        states.append(state)
    assert summarize_rest(states).text == "10.0M-19.0M/50.0M, median 14.5M"


def test_a_bar_state_made_by_position_is_written_as_tqdm_s_default() -> None:
    state = BarState(0, 0, "epoch", 3, 10, "it", 4.0, 0.5, "loss=1")
    expected = format_meter(3, 10, 4.0, prefix="epoch", rate=0.5, postfix="loss=1")
    assert text_view_line(state, tty=False) == expected
    assert widget_row(state) == ("epoch", "30%", "3/10 [00:04<00:14,  2.00s/it, loss=1]")


def test_a_closed_bar_shows_its_average_rate_as_tqdm_does_when_it_closes_one() -> None:
    state = BarState(0, 0, "epoch", 30, 100, "it", 10.0, 99.0, "", closed=True, initial=10)
    assert widget_row(state)[2] == "30/100 [00:10<00:35,  2.00it/s]"  # (30 - 10) / 10 s


def test_a_worker_s_bar_keeps_tqdm_s_smooth_blocks_unless_it_asks_for_ascii(clock: Clock) -> None:
    smooth = tqdm.tqdm(total=4, file=Discard(), desc="smooth")
    plain = tqdm.tqdm(total=4, file=Discard(), desc="plain", ascii=True)
    for bar in (smooth, plain):
        clock.now += 1
        bar.update(3)
    assert "██" in text_view_line(bar_state(smooth, 0, closed=False), tty=False)
    assert "##" in text_view_line(bar_state(plain, 1, closed=False), tty=False)
    smooth.close()
    plain.close()
