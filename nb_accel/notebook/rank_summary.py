"""With many ranks: which ranks get a row of their own, and one line that sums up the rest.

The rows go to the ranks that need a look: failed ones first, then stalled, stopped, and the
least advanced of the running ones; finished ranks last. The others are collapsed into one line,
e.g. "58 more · 40-45/100, median 42", whose note names every failed, stalled or stopped rank
among them, so that none is ever out of sight.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from ..launch.failures.verdict import rank_list
from ..launch.views.bar_text import amount_text
from .meter_text import count_text, known_total
from .rank_row import DONE, FAILED, STARTING, STOPPED, RankState

__all__ = ["RestSummary", "choose_shown", "summarize_rest"]


def _group(state: RankState) -> int:
    if state.status == FAILED:
        return 0
    if state.stalled_for is not None:
        return 1
    if state.status == STOPPED:
        return 2
    return 4 if state.status == DONE else 3


def choose_shown(states: Sequence[RankState], count: int) -> list[int]:
    """The indices of the ``count`` ranks that get a row, in rank order: failed, stalled and
    stopped ranks first, then the least advanced of the others (see
    :meth:`RankState.progress`), ties to the lower rank."""

    def key(index: int) -> tuple[int, tuple[float, ...], int]:
        state = states[index]
        group = _group(state)
        return group, state.progress() if group == 3 else (), index

    return sorted(sorted(range(len(states)), key=key)[:count])


@dataclass(frozen=True)
class RestSummary:
    """The collapsed line: its label, the bar (``value`` of ``total``, its style and
    description), the text after the bar, and a note naming the ranks that need a look."""

    label: str
    desc: str
    value: float
    total: float
    style: str
    text: str
    note: str
    note_color: str


def _spread(states: Sequence[RankState]) -> tuple[str, float, float]:
    """The main bars' spread as text ("40-45/100, median 42"), and the median as a bar."""
    bars = [b for b in (s.main_bar() for s in states) if b is not None]
    if not bars:
        return "", 0.0, 1.0
    totals = {b.total for b in bars}
    if all(known_total(b) for b in bars):
        if len(totals) == 1:
            total = float(bars[0].total or 1.0)
            values, suffix, unit = [b.n for b in bars], f"/{amount_text(bars[0], total)}", ""
        else:
            total, suffix, unit = 100.0, "", "%"
            values = [100.0 * b.n / (b.total or 1.0) for b in bars]
    else:
        values, suffix, unit, total = [b.n for b in bars], "", "", 0.0

    def written(value: float) -> str:  # a percentage, or a count of the bars' unit
        return count_text(round(value, 1)) if unit else amount_text(bars[0], value)

    low, high, median = min(values), max(values), statistics.median(values)
    span = written(low) if low == high else f"{written(low)}-{written(high)}"
    text = f"{span}{suffix}{unit}, median {written(median)}{unit}"
    return text, (median if total else 1.0), (total or 1.0)


def _note(states: Sequence[RankState]) -> tuple[str, str]:
    parts: list[str] = []
    color = "muted"
    failed = [s.rank for s in states if s.status == FAILED]
    stalled = [s.rank for s in states if s.status != FAILED and s.stalled_for is not None]
    stopped = [s for s in states if s.status == STOPPED]
    if failed:
        parts.append(f"failed: {rank_list(failed)}")
        color = "danger"
    if stalled:
        parts.append(f"stalled: {rank_list(stalled)}")
        color = "warning" if color == "muted" else color
    if stopped:
        reasons = {s.summary for s in stopped}
        why = f" ({reasons.pop()})" if len(reasons) == 1 and "" not in reasons else ""
        parts.append(f"stopped: {rank_list(s.rank for s in stopped)}{why}")
    for status, word in ((DONE, "done"), (STARTING, "starting")):
        count = sum(s.status == status and s.stalled_for is None for s in states)
        if count:
            parts.append(f"{count} {word}")
    return " · ".join(parts), color


def summarize_rest(states: Sequence[RankState]) -> RestSummary:
    """The line for the ranks without a row of their own."""
    text, value, total = _spread(states)
    descs = {b.desc for b in (s.main_bar() for s in states) if b is not None}
    note, color = _note(states)
    if any(s.status == FAILED for s in states):
        style = "danger"
    elif any(s.stalled_for is not None for s in states):
        style = "warning"
    elif states and all(s.status == DONE for s in states):
        style = "success"
    else:
        style = ""
    return RestSummary(
        label=f"{len(states)} more",
        desc=descs.pop() if len(descs) == 1 else "",
        value=value,
        total=total,
        style=style,
        text=text,
        note=note,
        note_color=color,
    )
