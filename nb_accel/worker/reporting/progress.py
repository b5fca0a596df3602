"""``nb_accel.tqdm``: tqdm's progress bar, reported to the kernel from inside a launch.

In a launched worker the bar draws nothing: at each refresh tqdm would draw (at most ten a
second, its ``mininterval``) it hands its state to the worker's reporter
(:mod:`~nb_accel.worker.reporting.reporter`), and the kernel shows every rank's bar in one view.
Outside a launch ``nb_accel.tqdm(...)`` is ``tqdm.auto.tqdm(...)``: a widget in a notebook, a
text bar elsewhere. Everything else — ``desc``, ``total``, ``unit``, ``update``,
``set_postfix``, ``leave``, nesting, iteration speed — is tqdm's own.
"""

from __future__ import annotations

import importlib
import io
import itertools
import numbers
from typing import Any

from tqdm.std import tqdm as std_tqdm

from ..._keywords import parameter_names, refuse_unknown
from ..._messages import BarState
from .reporter import Reporter, current_reporter

__all__ = ["tqdm", "trange", "bar_state", "next_bar_id", "Discard"]

_ids = itertools.count()
#: The keywords a bar takes: tqdm's, the notebook bar's ``display``, and the ``nested`` that
#: tqdm itself explains is gone.
_BAR_OPTIONS = (*parameter_names(std_tqdm.__init__), "display", "nested")


def next_bar_id() -> int:
    """A number for a new reported bar, unique in this process."""
    return next(_ids)


class Discard(io.TextIOBase):
    """Where a reported bar would draw: nowhere. It takes any text (its encoding is UTF-8, so
    tqdm gives the bar its smooth blocks unless the bar asks for ``ascii``)."""

    #: UTF-8: tqdm chooses a bar's characters by it.
    encoding = "utf-8"

    def write(self, text: str) -> int:
        return len(text)

    def isatty(self) -> bool:
        return False


def _number(value: Any) -> float:
    """A count as a plain number: an integer stays an ``int`` (tqdm writes ``3``, not ``3.0``)."""
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def bar_state(bar: std_tqdm, bar_id: int, closed: bool) -> BarState:  # type: ignore[type-arg]
    """What the launch view shows of ``bar`` (any tqdm bar), numbered ``bar_id``: the fields of
    its ``format_dict`` that tqdm's ``format_meter`` needs, small and picklable."""
    info = bar.format_dict
    total, rate, postfix = info.get("total"), info.get("rate"), info.get("postfix")
    unit_scale = info.get("unit_scale") or False
    position = abs(getattr(bar, "pos", 0) or 0)
    return BarState(
        bar=bar_id,
        level=position,
        desc=str(info.get("prefix") or ""),
        n=_number(info["n"]),
        total=_number(total) if total is not None else None,
        unit=str(info.get("unit") or "it"),
        elapsed=float(info.get("elapsed") or 0.0),
        rate=float(rate) if rate is not None else None,
        postfix=postfix if isinstance(postfix, str) else str(postfix or ""),
        closed=closed,
        leave=bool(bar.leave) if bar.leave is not None else position == 0,
        unit_scale=unit_scale if isinstance(unit_scale, bool) else _number(unit_scale),
        unit_divisor=_number(info.get("unit_divisor") or 1000),
        bar_format=str(info["bar_format"]) if info.get("bar_format") else None,
        initial=_number(info.get("initial") or 0),
        ascii=info.get("ascii") or False,
    )


class tqdm(std_tqdm):  # type: ignore[type-arg]
    """A tqdm progress bar that, inside a launch, shows up in the kernel's launch view.

    Takes every argument tqdm takes; any other keyword raises ``TypeError`` naming the
    argument it most likely meant. Outside a launch, constructing one gives a
    ``tqdm.auto.tqdm`` (a notebook widget or a text bar).
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        refuse_unknown("tqdm", kwargs, _BAR_OPTIONS, ending="see help(tqdm) for its arguments")
        if cls is tqdm and current_reporter() is None:
            auto = importlib.import_module("tqdm.auto").tqdm
            return auto(*args, **kwargs)
        return super().__new__(cls, *args, **kwargs)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._nb_reporter: Reporter | None = current_reporter()
        self._nb_bar = next_bar_id()
        if self._nb_reporter is not None:
            kwargs["file"] = Discard()
            kwargs.setdefault("dynamic_ncols", False)
        super().__init__(*args, **kwargs)

    def _nb_state(self, closed: bool) -> BarState:
        return bar_state(self, self._nb_bar, closed)

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        """Report the bar's state (inside a launch) or draw it (outside)."""
        if self._nb_reporter is None:
            return bool(super().display(msg, pos))
        self._nb_reporter.bar(self._nb_state(closed=False))
        return True

    def close(self) -> None:
        """Close the bar; inside a launch its final state is reported."""
        was_open = not getattr(self, "disable", True)
        super().close()
        if was_open and self._nb_reporter is not None:
            self._nb_reporter.bar(self._nb_state(closed=True))


def trange(*args: Any, **kwargs: Any) -> tqdm:
    """``tqdm(range(*args), **kwargs)``."""
    return tqdm(range(*args), **kwargs)


def main_process_tqdm(*args: Any, main_process_only: bool = True, **kwargs: Any) -> tqdm:
    """``accelerate.utils.tqdm``: a bar drawn on the main process only (every process still
    iterates), or on every process with ``main_process_only=False``. A bar drawn on every rank
    is what ``nb_accel.tqdm`` gives: one row per rank in the launch view."""
    if isinstance(args[0] if args else None, bool):
        raise TypeError(
            "tqdm's first argument is the iterable; pass main_process_only as a keyword "
            "(main_process_only=True)"
        )
    if main_process_only:
        from ...runtime.state import PartialState

        kwargs["disable"] = kwargs.get("disable", False) or not PartialState().is_main_process
    return tqdm(*args, **kwargs)
