"""The text of a widget row beside its bar, written by tqdm (see
:mod:`~nb_accel.launch.views.bar_text`), and the counts and durations the launch view writes in
its own words.

With tqdm's default format a row shows the bar's description and percentage before the bar
and tqdm's right side after it (``37/100 [00:03<00:05, 11.23it/s, loss=0.512]``; without a
total, tqdm's count and rate: ``42it [00:03, 11.23it/s]``). A bar with a ``bar_format`` of its
own is split around its ``{bar}`` as ``tqdm.notebook`` splits it: the text before the bar in
the description's place, the text after it beside the bar (all of it there when the format
draws no bar).
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

from tqdm.std import tqdm as std_tqdm

from .._messages import BarState
from ..launch.views.bar_text import has_total, meter

__all__ = [
    "RIGHT_OF_BAR",
    "BarTexts",
    "bar_texts",
    "count_of",
    "count_text",
    "duration_text",
    "known_total",
]

#: What tqdm's default format writes after the bar (its ``r_bar``, without the bar's edge).
RIGHT_OF_BAR = "{n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
#: ``{bar}`` in a ``bar_format``, with or without a format spec (``{bar:10}``).
_BAR_FIELD = re.compile(r"\{bar(:[^{}]*)?\}")
_MARK = "<bar/>"
#: tqdm's default format around the mark, without the description (the row shows it apart).
_DEFAULT_SIDES = "{percentage:.0f}%" + _MARK + RIGHT_OF_BAR
#: Where the text is split: at the mark, with the bar's edges (``|``) beside it.
_AROUND_MARK = re.compile(r"\|?<bar/>\|?")


class BarTexts(NamedTuple):
    """A row's texts around its bar: ``desc`` and ``percentage`` before it, ``right`` after."""

    desc: str
    percentage: str
    right: str


def bar_texts(state: BarState) -> BarTexts:
    """The texts a widget row shows around ``state``'s bar (see the module's description), from
    one call of tqdm's ``format_meter``."""
    if state.bar_format:
        text = meter(state, bar_format=_BAR_FIELD.sub(_MARK, state.bar_format))
        parts = _AROUND_MARK.split(text, maxsplit=1)
        return BarTexts(parts[0], "", parts[1]) if len(parts) == 2 else BarTexts("", "", text)
    if not has_total(state):
        return BarTexts(state.desc, "", meter(state, prefix="", total=None, bar_format=None))
    percentage, right = meter(state, bar_format=_DEFAULT_SIDES).split(_MARK, 1)
    return BarTexts(state.desc, percentage, right)


def count_of(state: BarState) -> str:
    """The bar's count as tqdm writes it, against its total when it has one: ``3/500``,
    ``10.0M/50.0M``, ``42``."""
    return meter(state, bar_format="{n_fmt}/{total_fmt}" if has_total(state) else "{n_fmt}")


def duration_text(seconds: float, precise: bool = False) -> str:
    """``"42 s"`` (``"41.7 s"`` when ``precise``) under a minute, else ``MM:SS``/``H:MM:SS``."""
    if seconds < 60:
        return f"{seconds:.1f} s" if precise else f"{int(seconds)} s"
    return str(std_tqdm.format_interval(seconds))


def count_text(n: float) -> str:
    """A number the view writes (a percentage of ranks' progress): without a fraction when whole."""
    return str(int(n)) if float(n).is_integer() else f"{n:.6g}"


def known_total(state: BarState) -> bool:
    """True when the bar has a finite, positive total (so a percentage means something)."""
    return state.total is not None and 0 < state.total < math.inf
