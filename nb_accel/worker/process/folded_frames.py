"""A worker's traceback as its user reads it: their own frames, the frames of the libraries they
called, and the message; the frames of nb_accel between them folded into one line that says how
many were left out.

An error raised inside torch keeps every frame (what nb_accel handed torch may be the cause),
and so does every traceback when :data:`FULL_TRACEBACKS_VARIABLE` is set to ``1`` in the
kernel before the launch.
"""

from __future__ import annotations

import os
import traceback
from types import TracebackType
from typing import Any

import torch

__all__ = ["FULL_TRACEBACKS_VARIABLE", "folded_traceback"]

#: Set to ``1`` to see nb_accel's own frames in workers' tracebacks.
FULL_TRACEBACKS_VARIABLE = "NB_ACCEL_FULL_TRACEBACKS"

_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
_TORCH = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def _ours(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_PACKAGE)


def _left_out(count: int) -> str:
    frames = "frame" if count == 1 else "frames"
    return f"  [{count} {frames} of nb_accel left out: {FULL_TRACEBACKS_VARIABLE}=1 shows them]\n"


class _FoldedStack(traceback.StackSummary):
    """A stack whose runs of nb_accel's frames format as one line each."""

    def format(self, **options: Any) -> list[str]:
        """The stack's lines; ``options`` as the standard library's (Python 3.13 passes
        ``colorize``)."""
        lines: list[str] = []
        run = 0
        for frame in self:
            if _ours(frame.filename):
                run += 1
                continue
            if run:
                lines.append(_left_out(run))
                run = 0
            lines.extend(traceback.StackSummary.from_list([frame]).format(**options))
        if run:
            lines.append(_left_out(run))
        return lines


def _fold(exception: traceback.TracebackException, seen: set[int]) -> None:
    """Fold the stacks of ``exception`` and of those chained to it, each once."""
    if id(exception) in seen:
        return
    seen.add(id(exception))
    stack = exception.stack
    raised_in_torch = bool(stack) and os.path.abspath(stack[-1].filename).startswith(_TORCH)
    if not raised_in_torch:
        exception.stack = _FoldedStack(stack)
    for chained in (exception.__cause__, exception.__context__):
        if chained is not None:
            _fold(chained, seen)
    for member in getattr(exception, "exceptions", None) or ():
        _fold(member, seen)


def folded_traceback(exc: BaseException, tb: TracebackType | None) -> str:
    """``exc`` formatted from ``tb`` on, with nb_accel's frames folded (see the module)."""
    formatted = traceback.TracebackException(type(exc), exc, tb, compact=True)
    if os.environ.get(FULL_TRACEBACKS_VARIABLE) != "1":
        _fold(formatted, set())
    return "".join(formatted.format())
