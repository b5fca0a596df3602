"""How an exception raised by nb_accel is shown in a notebook: the user's frames only.

IPython asks an exception for ``_render_traceback_()`` before formatting it; nb_accel's entry
points attach :func:`render` there (through
:func:`~nb_accel.launch.failures.user_errors.register_traceback_renderer`). It formats the
exception with the shell's own traceback formatter (same colours and ``%xmode``), leaving out the
frames of the package and of the kernel's plumbing it called into (IPython, ipykernel, ipywidgets,
traitlets, comm, zmq, tornado, asyncio): what remains are the user's own frames, the message,
and the chained cause (a worker's traceback, its frames in notebook cells named as IPython
names them: ``Cell In[7], line 3``). ``%xmode --show`` (show hidden frames) shows every frame
the exception still has.

A ``%%distributed`` cell is compiled in the kernel before it is sent (:func:`check_syntax`): its
syntax error is shown as IPython shows any cell's, the line and the caret, without the frames
of the magic that found it (IPython shows a syntax error raised by running code with every
frame, and asks no ``_render_traceback_`` of it; a handler of the shell's custom exceptions,
:func:`show_cell_syntax_errors`, shows it instead).
"""

from __future__ import annotations

import re
from types import FrameType, TracebackType
from typing import Any

from ..errors import RemoteTraceback
from . import compat_shell

__all__ = [
    "CellSyntaxError",
    "cell_place",
    "check_syntax",
    "name_cells",
    "render",
    "show_cell_syntax_errors",
    "user_traceback",
]

#: Modules whose frames are plumbing, not the user's code.
HIDDEN_MODULES = (
    "nb_accel",
    "IPython",
    "ipykernel",
    "ipywidgets",
    "traitlets",
    "comm",
    "zmq",
    "tornado",
    "asyncio",
)


def _hidden(frame: FrameType) -> bool:
    name = str(frame.f_globals.get("__name__", ""))
    return name.split(".", 1)[0] in HIDDEN_MODULES


def user_traceback(tb: TracebackType | None) -> TracebackType | None:
    """A copy of the traceback chain ``tb`` without the hidden modules' frames."""
    kept: list[TracebackType] = []
    while tb is not None:
        if not _hidden(tb.tb_frame):
            kept.append(tb)
        tb = tb.tb_next
    chain: TracebackType | None = None
    for entry in reversed(kept):
        chain = TracebackType(chain, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return chain


#: A frame line of a formatted traceback: its file and line.
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def name_cells(text: str, shell: Any) -> str:
    """``text`` (a formatted traceback) with the files of the shell's cells named as IPython
    names them (``Cell In[7], line 3``)."""

    def named(match: re.Match[str]) -> str:
        label = compat_shell.cell_label(shell, match.group(1))
        return f"{label[0]} {label[1]}, line {match.group(2)}" if label else match.group(0)

    return _FRAME.sub(named, text)


def cell_place(path: str) -> str | None:
    """The running shell's name for the file of one of its cells (``Cell In[7]``), or
    ``None`` (no shell, or not a cell)."""
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        return None
    try:
        label = compat_shell.cell_label(shell, path)
    except Exception:  # noqa: BLE001 - an unknown file keeps its own name
        return None
    return f"{label[0]} {label[1]}" if label else None


def render(error: BaseException, kernel_frames: bool = True) -> list[str]:
    """``error`` formatted by the running IPython shell without hidden frames (and without any
    kernel frame when ``kernel_frames`` is False)."""
    from IPython import get_ipython

    shell = get_ipython()
    tb = user_traceback(error.__traceback__) if kernel_frames else None
    if shell is None:
        import traceback

        return traceback.format_exception(type(error), error, tb)
    if not getattr(shell.InteractiveTB, "skip_hidden", True):  # %xmode --show: every frame
        tb = error.__traceback__
    cause = error.__cause__
    if isinstance(cause, RemoteTraceback):  # a function defined in a cell, run in a worker
        cause.text = name_cells(cause.text, shell)
    lines: list[str] = shell.InteractiveTB.structured_traceback(type(error), error, tb, tb_offset=0)
    return compat_shell.with_notes(shell, error, lines)


class CellSyntaxError(SyntaxError):
    """A ``%%distributed`` cell's syntax error, found in the kernel before any rank ran it."""


def check_syntax(source: str, filename: str) -> None:
    """Raise :class:`CellSyntaxError` when ``source`` (a cell, run under ``filename``) does not
    compile; the workers would fail on it the same way."""
    try:
        compile(source, filename, "exec", dont_inherit=True)
    except SyntaxError as error:
        found = CellSyntaxError(
            error.msg,
            (
                error.filename,
                error.lineno,
                error.offset,
                error.text,
                error.end_lineno,
                error.end_offset,
            ),
        )
        raise found from None


def show_cell_syntax_errors(shell: Any) -> None:
    """Have ``shell`` show a :class:`CellSyntaxError` as it shows a cell's own syntax error;
    the custom exceptions already registered there keep their handler."""
    previous_types = tuple(shell.custom_exceptions)
    if CellSyntaxError in previous_types:
        return
    previous = shell.CustomTB if previous_types else None

    def handler(
        self: Any, etype: type, value: BaseException, tb: Any, tb_offset: int | None = None
    ) -> list[str] | None:
        if previous is not None and not issubclass(etype, CellSyntaxError):
            return previous(etype, value, tb, tb_offset=tb_offset)  # type: ignore[no-any-return]
        # shown (and named in the kernel's reply) as the SyntaxError it is to the user
        lines: list[str] = self.SyntaxTB.structured_traceback(SyntaxError, value, [])
        lines = compat_shell.name_cell_files(self, lines)
        self._showtraceback(SyntaxError, value, lines)
        return lines

    shell.set_custom_exc((*previous_types, CellSyntaxError), handler)
