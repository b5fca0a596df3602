"""Where IPython 7 and 8/9 differ for nb_accel's magics and tracebacks: the one seam.

Colab and Kaggle run IPython 7.34 (with ipykernel 6.17); a current Jupyter IPython 9. IPython 8
names a cell's code ``Cell In[5]`` (its compiler's ``format_code_name``); IPython 7 has no such
method, and ipykernel 6 names cells by a hash of their code. On 7, :func:`note_cell_numbers`
(called when nb_accel is imported in a kernel) and :func:`cache_cell` note the numbers
themselves, and :func:`cell_label` finds an earlier cell in the shell's history by the code cached
under its name, so that tracebacks and stacks name cells the same way on every IPython
(:func:`name_cell_files` for the lines IPython 7 formats itself). IPython 7 also leaves an
exception's notes (PEP 678) out of its tracebacks: :func:`with_notes` adds them.
"""

from __future__ import annotations

import linecache
import os
import re
from typing import Any

__all__ = [
    "cache_cell",
    "cell_label",
    "name_cell_files",
    "note_cell_numbers",
    "shows_notes",
    "with_notes",
]

#: The cells :func:`cache_cell` cached on IPython 7, by file name: their numbers.
_cached_numbers: dict[str, int] = {}
#: IPython 7's own names for its cells (``<ipython-input-5-0123abcd>``).
_INPUT_NAME = re.compile(r"<ipython-input-(\d+)-[0-9a-f]+>")


_MARK = "_nb_accel_notes_numbers"


def note_cell_numbers(shell: Any) -> None:
    """Have ``shell`` (on IPython 7) note the number of every cell it caches from now on, as
    IPython 8's compiler does itself; nothing on IPython 8 or without a shell."""
    compiler = getattr(shell, "compile", None)
    if compiler is None or hasattr(compiler, "format_code_name"):
        return
    original = compiler.cache
    if getattr(original, _MARK, False):
        return

    def cache(transformed_code: str, number: int = 0, raw_code: str | None = None) -> str:
        name = str(original(transformed_code, number, raw_code))
        _cached_numbers[name] = number
        return name

    setattr(cache, _MARK, True)
    compiler.cache = cache  # this shell's compiler only
    cached = {name: _cached_lines(name) for name in list(linecache.cache)}
    cells = {name: entry for name, entry in cached.items() if entry and _is_cell_file(shell, name)}
    if cells:  # the cell running now (importing nb_accel) was cached last, under this number
        running = max(cells, key=lambda name: cells[name][0])
        _cached_numbers.setdefault(running, int(shell.execution_count))


def _cached_lines(filename: str) -> tuple[float, list[str]] | None:
    """When ``filename``'s lines were cached, and the lines (``None``: not cached whole)."""
    entry: tuple[Any, ...] = tuple(linecache.cache.get(filename, ()))
    if len(entry) != 4:  # a lazy entry, or none
        return None
    return float(entry[1] or 0.0), list(entry[2])


def cache_cell(shell: Any, code: str, number: int) -> str:
    """Cache ``code`` in ``shell``'s compiler as cell ``number`` (so that tracebacks show its
    lines) and return the file name it runs under."""
    name = str(shell.compile.cache(code, number))
    if not hasattr(shell.compile, "format_code_name"):
        _cached_numbers[name] = number
    return name


def cell_label(shell: Any, filename: str) -> tuple[str, str] | None:
    """How ``shell`` names the cell whose code runs under ``filename`` (``("Cell", "In[5]")``),
    or ``None`` when it is not a cell's."""
    compiler = shell.compile
    format_code_name = getattr(compiler, "format_code_name", None)
    if format_code_name is not None:
        label = format_code_name(filename)
        return (str(label[0]), str(label[1])) if label else None
    number = _cached_numbers.get(filename)
    if number is None:
        found = _INPUT_NAME.fullmatch(filename)
        number = int(found.group(1)) if found else _history_number(shell, filename)
    return ("Cell", f"In[{number}]") if number is not None else None


def _is_cell_file(shell: Any, filename: str) -> bool:
    """Whether ``filename`` names a cell's code: where ``shell``'s compiler puts cells
    (ipykernel 6: a folder of its own), or IPython 7's own ``<ipython-input-...>``."""
    if _INPUT_NAME.fullmatch(filename):
        return True
    namer = getattr(shell.compile, "get_code_name", None)
    if namer is None:
        return False
    folder = os.path.dirname(str(namer("", "", 0)))
    return bool(folder) and os.path.dirname(filename) == folder


def _history_number(shell: Any, filename: str) -> int | None:
    """The number of the history's cell whose code the shell cached under ``filename``, found
    by its text (ipykernel 6 names a cell by a hash of its code), newest first."""
    cached = _cached_lines(filename)
    if cached is None or not _is_cell_file(shell, filename):
        return None
    text = "".join(cached[1]).rstrip()
    history = getattr(getattr(shell, "history_manager", None), "input_hist_parsed", None) or []
    for number in range(len(history) - 1, 0, -1):
        if history[number].rstrip() == text:
            _cached_numbers[filename] = number
            return number
    return None


# -- traceback text IPython 7 leaves out ---------------------------------------------------------

#: A frame's place in a formatted traceback, colours and all: ``File "...", line 3``.
_PLACE = re.compile(r'File ((?:\x1b\[[0-9;]*m)*)"([^"]+)"((?:\x1b\[[0-9;]*m)*), line')


def name_cell_files(shell: Any, lines: list[str]) -> list[str]:
    """``lines`` of a formatted traceback with ``File "<a cell's file>", line 3`` written as
    IPython 8 writes it, ``Cell In[5], line 3`` (IPython 7 writes the file's path)."""

    def named(match: re.Match[str]) -> str:
        label = cell_label(shell, match.group(2))
        if label is None:
            return match.group(0)
        return f"{match.group(1)}{label[0]} {label[1]}{match.group(3)}, line"

    return [_PLACE.sub(named, line) for line in lines]


_notes_shown: bool | None = None


def shows_notes(shell: Any) -> bool:
    """Whether ``shell``'s traceback formatter shows an exception's notes (PEP 678): IPython 8
    does; IPython 7 leaves them out. Found once, by formatting an exception with one."""
    global _notes_shown  # noqa: PLW0603 - a fact of the running IPython, found once
    if _notes_shown is None:
        probe = ValueError("probe")
        marker = "nb_accel: is this note shown?"
        setattr(probe, "__notes__", [marker])  # noqa: B010 - add_note is Python 3.11's
        try:
            lines = shell.InteractiveTB.structured_traceback(ValueError, probe, None, tb_offset=0)
        except Exception:  # noqa: BLE001 - a formatter that cannot say shows nothing extra
            lines = []
        _notes_shown = any(marker in line for line in lines)
    return _notes_shown


def with_notes(shell: Any, error: BaseException, lines: list[str]) -> list[str]:
    """``lines`` (``error`` formatted by ``shell``) with ``error``'s notes after them where the
    shell's formatter leaves notes out."""
    notes = getattr(error, "__notes__", None)
    if not notes or shows_notes(shell):
        return lines
    return [*lines, *(str(note) for note in notes)]
