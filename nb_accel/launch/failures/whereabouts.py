"""Where each rank is: its Python stacks, taken without stopping it, and said in one line.

:func:`take_stacks` signals the ranks (:data:`~nb_accel.runtime.reporting.stacks.STACK_SIGNAL`)
and reads what each one's ``faulthandler`` wrote to its stack file. :meth:`RankStack.summary`
says where the main thread is in the user's code: ``at `stuck_here` (Cell In[3], line 4) ←
`train` (line 8), inside torch``; :meth:`RankStack.text` gives every thread's frames.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...runtime.reporting.stacks import MAIN_THREAD, STACK_SIGNAL, stack_file

__all__ = ["Frame", "RankStack", "ThreadStack", "parse_stacks", "take_stacks"]

#: How long the kernel waits for a rank's stacks.
STACK_WAIT_S = 1.0

#: How often the kernel looks whether a rank has finished writing them.
_POLL_S = 0.01

_THREAD = re.compile(r"^(Current thread|Thread) 0x([0-9a-fA-F]+) ")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')

#: Folders of code that is not the user's: the standard library, installed packages, nb_accel.
_LIBRARY_ROOTS = tuple(
    {
        os.path.realpath(path)
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
        if (path := sysconfig.get_paths().get(key))
    }
)
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


@dataclass(frozen=True)
class Frame:
    """One frame: its file, line and function."""

    path: str
    line: int
    function: str

    @property
    def library(self) -> str | None:
        """The installed package (or ``"Python"``) the frame's code belongs to; ``None`` for
        the user's code."""
        path = os.path.realpath(self.path) if self.path.startswith("/") else self.path
        if path.startswith(_PACKAGE_ROOT + os.sep):
            return "nb_accel"
        for root in _LIBRARY_ROOTS:
            if path.startswith(root + os.sep):
                rest = path[len(root) + 1 :]
                if "site-packages" in root or "dist-packages" in root:
                    return rest.split(os.sep, 1)[0].removesuffix(".py")
                return "Python"
        if path.startswith("<") and not path.startswith("<ipython-input"):
            return "Python"  # frozen modules, ``python -c``'s code
        return None


@dataclass
class ThreadStack:
    """One thread's frames, innermost first."""

    ident: int
    frames: list[Frame] = field(default_factory=list)


@dataclass
class RankStack:
    """A rank's stacks as its ``faulthandler`` wrote them.

    Attributes:
        rank: the rank.
        main: the main thread's stack (``None`` when it was not found).
        threads: every thread's, as written.
    """

    rank: int
    main: ThreadStack | None
    threads: list[ThreadStack]

    def summary(self) -> str:
        """Where the main thread is, in the user's code first: ``at `f` (Cell In[3], line 4)
        ← `train` (line 8), inside torch``; ``idle`` when none of its frames is the user's."""
        if self.main is None or not self.main.frames:
            return "somewhere without Python frames"
        frames = self.main.frames
        mine = [f for f in frames if f.library is None]
        if not mine:
            return "idle"
        parts, last = [], ""
        for frame in mine[:3]:
            place = _place(frame.path)
            where = f"line {frame.line}" if place == last else f"{place}, line {frame.line}"
            parts.append(f"`{frame.function}` ({where})")
            last = place
        text = "at " + " ← ".join(parts)
        inner = frames[0].library
        if frames[0] is not mine[0] and inner is not None:
            text += f", inside {inner}"
        return text

    def text(self) -> str:
        """Every thread's frames, the main thread first, innermost frame last (as Python
        prints a traceback)."""
        blocks = []
        ordered = sorted(self.threads, key=lambda t: t is not self.main)
        for thread in ordered:
            title = "main thread" if thread is self.main else f"thread 0x{thread.ident:x}"
            lines = [f"  {_place(f.path)}, line {f.line}, in {f.function}" for f in thread.frames]
            blocks.append(f"{title}:\n" + "\n".join(reversed(lines)))
        return "\n".join(blocks)


def _place(path: str) -> str:
    """A file as the user knows it: a notebook cell as IPython names it (``Cell In[3]``), a
    file by its name."""
    shell = _shell()
    if shell is not None:
        try:
            label = shell.compile.format_code_name(path)
        except Exception:  # noqa: BLE001 - an unknown file keeps its name
            label = None
        if label:
            return f"{label[0]} {label[1]}"
    return os.path.basename(path) or path


def _shell() -> Any:
    if "IPython" not in sys.modules:
        return None
    from IPython import get_ipython

    return get_ipython()


def parse_stacks(rank: int, header: str, dump: str) -> RankStack:
    """A :class:`RankStack` from a stack file's first line (``header``) and one dump."""
    main_ident = int(header[len(MAIN_THREAD) :], 16) if header.startswith(MAIN_THREAD) else None
    threads: list[ThreadStack] = []
    for line in dump.splitlines():
        if found := _THREAD.match(line):
            threads.append(ThreadStack(int(found.group(2), 16)))
        elif (frame := _FRAME.match(line)) and threads:
            threads[-1].frames.append(Frame(frame.group(1), int(frame.group(2)), frame.group(3)))
    main = next((t for t in threads if t.ident == main_ident), None)
    return RankStack(rank, main, threads)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return -1


def take_stacks(
    folder: str, pids: Mapping[int, int], wait_s: float = STACK_WAIT_S
) -> dict[int, RankStack]:
    """Every rank's stacks (rank -> pid in ``pids``), from the launch's ``folder``; a rank
    that cannot be asked or does not answer within ``wait_s`` is left out."""
    starts: dict[int, int] = {}
    for rank, pid in pids.items():
        size = _size(stack_file(folder, rank))
        if size < 0:
            continue  # it has not registered (not started yet, or no folder)
        try:
            os.kill(pid, STACK_SIGNAL)
        except OSError:
            continue
        starts[rank] = size
    seen: dict[int, int] = {}
    pending = set(starts)
    deadline = time.monotonic() + wait_s
    while pending and time.monotonic() < deadline:
        time.sleep(_POLL_S)  # the handler writes at once, in pieces: wait until it stops
        for rank in list(pending):
            size = _size(stack_file(folder, rank))
            if size > starts[rank] and seen.get(rank) == size:
                pending.discard(rank)
            seen[rank] = size
    stacks: dict[int, RankStack] = {}
    for rank, begin in starts.items():
        if seen.get(rank, begin) <= begin:
            continue  # no answer
        with open(stack_file(folder, rank), encoding="utf-8", errors="replace") as stream:
            header = stream.readline().strip()
            stream.seek(begin)
            dump = stream.read()
        stacks[rank] = parse_stacks(rank, header, dump)
    return stacks
