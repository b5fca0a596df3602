"""Every tqdm bar a worker draws — ``tqdm.tqdm``, ``tqdm.auto.tqdm``, a library's own — reported
to the kernel like ``nb_accel.tqdm``: one row per rank in the launch view, no bar text in the
output.

:func:`report_plain_bars` runs in a worker only, before the launched function. It changes tqdm's
base class in that process: a bar made there draws into nothing and hands its state to the
worker's reporter each time tqdm would draw it (and when it closes). A notebook bar
(``tqdm.notebook``, or ``tqdm.auto`` in a worker forked from a Jupyter kernel) would display a
widget that no front end can show: in a worker its class loses its widget methods, so that its
bars (and those of its subclasses) work as text bars and report the same way. Disabled bars
stay silent; subclasses that draw on their own (``tqdm.rich``, ``tqdm.gui``) are left as they
are.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FunctionType
from typing import Any

from tqdm.std import tqdm as std_tqdm

from .progress import Discard, bar_state, next_bar_id
from .progress import tqdm as nb_tqdm
from .reporter import Reporter, current_reporter

__all__ = ["report_plain_bars"]

#: Marks tqdm's base class once it reports (a worker sets it up once).
_MARK = "_nb_accel_reports_bars"
#: Where tqdm's ``__init__`` takes ``file`` when it is passed by position.
_FILE_POSITION = 4


def _reporter_for(bar: object) -> Reporter | None:
    """The reporter a plain bar reports to (``None`` for ``nb_accel.tqdm``, which reports on its
    own, and outside a launch)."""
    return None if isinstance(bar, nb_tqdm) else current_reporter()


def _is_notebook_bar(cls: type) -> bool:
    return any(klass.__module__ == "tqdm.notebook" for klass in cls.__mro__)


def _as_text_bars(module_name: str = "tqdm.notebook") -> None:
    """Take the widget methods off the notebook bar classes of ``module_name``: their bars (and
    those of subclasses, such as ``tqdm.auto``'s in a notebook or a library's own) then work
    as tqdm's text bars do, and report."""
    module = sys.modules.get(module_name)
    for klass in vars(module).values() if module is not None else ():
        if not (isinstance(klass, type) and issubclass(klass, std_tqdm)):
            continue
        if klass.__module__ != module_name:
            continue
        for name, value in list(vars(klass).items()):
            if isinstance(value, (FunctionType, staticmethod, classmethod, property)):
                delattr(klass, name)


def _wrap_new(original: Callable[..., Any]) -> Callable[..., Any]:
    def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
        if _is_notebook_bar(cls) and current_reporter() is not None:
            _as_text_bars()  # tqdm.notebook imported after the worker started
        return original(cls, *args, **kwargs)

    return __new__


def _wrap_init(original: Callable[..., None]) -> Callable[..., None]:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        reporter = _reporter_for(self)
        self._nb_plain_reporter = reporter
        if reporter is not None:
            self._nb_plain_bar = next_bar_id()
            if len(args) > _FILE_POSITION:
                args = (*args[:_FILE_POSITION], Discard(), *args[_FILE_POSITION + 1 :])
            else:
                kwargs["file"] = Discard()
            kwargs.setdefault("dynamic_ncols", False)
        original(self, *args, **kwargs)

    return __init__


def _wrap_display(original: Callable[..., Any]) -> Callable[..., Any]:
    def display(self: Any, msg: str | None = None, pos: int | None = None) -> Any:
        reporter: Reporter | None = getattr(self, "_nb_plain_reporter", None)
        if reporter is None:
            return original(self, msg, pos)
        reporter.bar(bar_state(self, self._nb_plain_bar, closed=False))
        return True

    return display


def _wrap_close(original: Callable[[Any], None]) -> Callable[[Any], None]:
    def close(self: Any) -> None:
        was_open = not getattr(self, "disable", True)
        original(self)
        reporter: Reporter | None = getattr(self, "_nb_plain_reporter", None)
        if was_open and reporter is not None:
            reporter.bar(bar_state(self, self._nb_plain_bar, closed=True))

    return close


def report_plain_bars() -> None:
    """Make every tqdm bar made in this process from now on report to the launch view instead
    of drawing. For a launched worker only: the kernel's tqdm is never changed."""
    if getattr(std_tqdm, _MARK, False):
        return
    std_tqdm.__new__ = staticmethod(_wrap_new(std_tqdm.__new__))  # type: ignore[assignment]
    std_tqdm.__init__ = _wrap_init(std_tqdm.__init__)  # type: ignore[method-assign]
    std_tqdm.display = _wrap_display(std_tqdm.display)  # type: ignore[method-assign]
    std_tqdm.close = _wrap_close(std_tqdm.close)  # type: ignore[method-assign]
    setattr(std_tqdm, _MARK, True)
    _as_text_bars()
