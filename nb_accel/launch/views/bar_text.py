"""A bar's text, written by tqdm itself (``tqdm.std.tqdm.format_meter``) from the fields of the
bar's ``format_dict`` its worker sent (:class:`~nb_accel._messages.BarState`): the bar's units,
``unit_scale``, ``bar_format`` and postfix read as tqdm would show them.

A closed bar is written with its average rate over the whole run, as tqdm writes a bar it
closes, not with the last smoothed rate.
"""

from __future__ import annotations

import math
from typing import Any

from tqdm.std import tqdm as std_tqdm

from ..._messages import BarState

__all__ = ["amount_text", "bar_fields", "has_total", "meter"]


def bar_fields(state: BarState, **changes: Any) -> dict[str, Any]:
    """The arguments of tqdm's ``format_meter`` for ``state``, with ``changes`` made to them
    (``ncols=100``, ``bar_format="{n_fmt}"``, ...)."""
    fields: dict[str, Any] = {
        "n": state.n,
        "total": state.total,
        "elapsed": state.elapsed,
        "prefix": state.desc,
        "ascii": state.ascii,
        "unit": state.unit,
        "unit_scale": state.unit_scale,
        "rate": None if state.closed else state.rate,
        "bar_format": state.bar_format,
        "postfix": state.postfix,
        "unit_divisor": state.unit_divisor,
        "initial": state.initial,
    }
    fields.update(changes)
    return fields


def meter(state: BarState, **changes: Any) -> str:
    """tqdm's text for ``state``: ``format_meter(**bar_fields(state, **changes))``."""
    return str(std_tqdm.format_meter(**bar_fields(state, **changes)))


def has_total(state: BarState) -> bool:
    """Whether tqdm writes ``state`` against its total (``n/total``, a percentage, the time
    left): a total that is set, finite and not overrun by the count."""
    total = state.total
    return bool(total) and total is not None and math.isfinite(total) and state.n < total + 0.5


def amount_text(state: BarState, amount: float) -> str:
    """``amount`` of ``state``'s unit as tqdm writes the bar's count (``10.0M`` with
    ``unit_scale``); a whole amount is written without a fraction."""
    whole = int(amount) if float(amount).is_integer() else amount
    return meter(state, n=whole, total=None, initial=0, bar_format="{n_fmt}")
