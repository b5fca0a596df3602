"""Where each rank is: its Python stacks, taken without stopping it, and said in one line.

:func:`take_stacks` signals the ranks (:data:`~nb_accel.worker.reporting.stacks.STACK_SIGNAL`)
and reads what each one's ``faulthandler`` wrote to its stack file. :meth:`RankStack.summary`
says where the main thread is in the user's code: ``at `stuck_here` (Cell In[3], line 4) ←
`train` (line 8), inside torch``; :meth:`RankStack.text` gives every thread's frames.
"""

from __future__ import annotations

import contextlib
import os
import re
import textwrap
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ...worker.reporting.collective_trail import (
    ABORT,
    ASK,
    LastCollective,
    answer_file,
    request_file,
)
from ...worker.reporting.stacks import MAIN_THREAD, STACK_SIGNAL, stack_file
from ...worker.transfer.code_files import LIBRARY_ROOTS

__all__ = [
    "Frame",
    "PlaceNamer",
    "RankStack",
    "ThreadStack",
    "abort_collectives",
    "in_own_code",
    "parse_stacks",
    "register_place_namer",
    "stacks_note",
    "where_lines",
    "take_stacks",
    "wait_per_round",
]

#: How many of the user's frames a summary names.
_SUMMARISED = 3

#: How long the kernel waits for a rank's stacks.
STACK_WAIT_S = 1.0
#: The most rounds of waiting :func:`take_stacks` makes: the dumps, a dump cut short asked
#: again, the last collectives.
_ROUNDS = 3

#: How often the kernel looks whether a rank has finished writing them.
_POLL_S = 0.01

_THREAD = re.compile(r"^(Current thread|Thread) 0x([0-9a-fA-F]+) ")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
#: The worker's own code and the library it runs: frames older than the outermost of them are
#: the kernel's (a forked worker's stack still holds the frames it was forked in).
_WORKER_ROOTS = tuple(os.path.join(_PACKAGE_ROOT, name) + os.sep for name in ("worker", "runtime"))


@dataclass(frozen=True)
class Frame:
    """One frame: its file, line and function."""

    path: str
    line: int
    function: str

    @property
    def place(self) -> str:
        """Where it is, as the user knows it: ``Cell In[3], line 4``, ``train.py, line 8``."""
        return f"{_place(self.path)}, line {self.line}"

    @property
    def library(self) -> str | None:
        """The installed package (or ``"Python"``) the frame's code belongs to; ``None`` for
        the user's code."""
        path = os.path.realpath(self.path) if self.path.startswith("/") else self.path
        if path.startswith(_PACKAGE_ROOT + os.sep):
            return "nb_accel"
        for root in LIBRARY_ROOTS:
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
        collective: the collective the rank last entered, when it was asked and could say.
    """

    rank: int
    main: ThreadStack | None
    threads: list[ThreadStack]
    collective: LastCollective | None = None

    @property
    def innermost_library(self) -> str | None:
        """The package the main thread's innermost frame belongs to (``"torch"``: waiting
        in a collective, say); ``None`` for the user's code or no frame."""
        if self.main is None or not self.main.frames:
            return None
        return self.main.frames[0].library

    @property
    def idle(self) -> bool:
        """Whether the main thread has frames but none of them is the user's."""
        frames = self.main.frames if self.main is not None else []
        return bool(frames) and all(f.library is not None for f in frames)

    def summary(self, idle: str = "idle") -> str:
        """Where the main thread is, in the user's code first: ``at `f` (Cell In[3], line 4)
        ← `train` (line 8), inside torch``; ``idle`` when none of its frames is the user's;
        then the last collective it entered, when known (``; last collective: all_reduce
        #3``). ``idle`` is what an idle rank is said to be."""
        text = idle if self.idle else self._in_user_code()
        if self.collective is not None:
            text += f"; last collective: {self.collective.describe()}"
        return text

    def _in_user_code(self) -> str:
        if self.main is None or not self.main.frames:
            return "somewhere without Python frames"
        frames = self.main.frames
        mine = [f for f in frames if f.library is None]
        parts, last = [], ""
        for frame in mine[:_SUMMARISED]:
            place = _place(frame.path)
            where = f"line {frame.line}" if place == last else f"{place}, line {frame.line}"
            parts.append(f"`{frame.function}` ({where})")
            last = place
        text = "at " + " ← ".join(parts)
        inner = frames[0].library
        if frames[0] is not mine[0] and inner is not None:
            text += f", inside {inner}"
        return text

    def text(self, idle_main: bool = True, users_threads: bool = False) -> str:
        """Every thread's frames but nb_accel's own (and its threads), the main thread first,
        innermost frame last (as Python prints a traceback); without ``idle_main``, the main
        thread is left out when it is idle; with ``users_threads``, the other threads only when
        they run the user's code."""
        blocks = []
        for thread in self._shown_threads(users_threads):
            if thread is self.main and not idle_main and self.idle:
                continue
            title = "main thread" if thread is self.main else f"thread 0x{thread.ident:x}"
            lines = [
                f"  {_place(f.path)}, line {f.line}, in {f.function}"
                for f in thread.frames
                if f.library != "nb_accel"
            ]
            if not lines and thread is not self.main:
                continue
            blocks.append(f"{title}:\n" + "\n".join(reversed(lines)))
        return "\n".join(blocks)

    def _shown_threads(self, users_threads: bool) -> list[ThreadStack]:
        """The main thread first, then the others but nb_accel's own (and, with
        ``users_threads``, those that run none of the user's code)."""
        shown = [self.main] if self.main is not None else []
        for thread in self.threads:
            if thread is self.main or (thread.frames and thread.frames[-1].library == "nb_accel"):
                continue  # one of nb_accel's own threads (the collective trail's, say)
            if users_threads and all(f.library is not None for f in thread.frames):
                continue
            shown.append(thread)
        return shown

    @property
    def told_by_summary(self) -> bool:
        """Whether :meth:`summary` says all the stack would: the main thread alone, in the
        user's code only, in no more frames than the summary names."""
        main = [f for f in (self.main.frames if self.main else []) if f.library != "nb_accel"]
        others = self._shown_threads(users_threads=True)[1:]
        return not others and all(f.library is None for f in main) and len(main) <= _SUMMARISED


def in_own_code(ranks: list[int], stacks: Mapping[int, RankStack]) -> list[int]:
    """The ranks of ``ranks`` that do not wait in a collective: in the user's code (or a
    library of theirs), or unable to say where they are (not in ``stacks``). A gloo rank
    waiting in one is inside torch (its innermost frame); an NCCL rank's flight recorder says
    its collective has not finished."""
    return [
        rank
        for rank in ranks
        if (stack := stacks.get(rank)) is None
        or not (
            stack.innermost_library == "torch" or (stack.collective and stack.collective.waiting)
        )
    ]


def where_lines(stacks: Mapping[int, RankStack], verb: str) -> list[str]:
    """A line for each rank in ``stacks``, in rank order: ``"  rank 1 was at `f` (...)"``
    (``verb``: ``"was"``, ``"is"``)."""
    return [f"  rank {rank} {verb} {stacks[rank].summary()}" for rank in sorted(stacks)]


def stacks_note(stacks: Mapping[int, RankStack]) -> str:
    """The stacks of each rank in ``stacks`` that say more than its summary (the main
    thread's frames, and the other threads that run the user's code), under a line naming the
    rank, for a note on an exception; ``""`` when none does."""
    blocks = []
    for rank in sorted(stacks):
        if stacks[rank].told_by_summary:
            continue
        text = stacks[rank].text(users_threads=True)
        blocks.append(f"Rank {rank}'s stacks:\n" + textwrap.indent(text or "(no frames)", "  "))
    return "\n".join(blocks)


#: Names a file as the user knows it (a notebook's cell: ``Cell In[3]``), or ``None``.
PlaceNamer = Callable[[str], str | None]

_namers: list[PlaceNamer] = []


def register_place_namer(namer: PlaceNamer) -> None:
    """Name files with ``namer`` first (the notebook layer names its shell's cells)."""
    _namers[:] = [namer]


def _place(path: str) -> str:
    """A file as the user knows it: a notebook cell as its shell names it, a file by its
    name."""
    for namer in _namers:
        named = namer(path)
        if named:
            return named
    return os.path.basename(path) or path


def parse_stacks(rank: int, header: str, dump: str) -> RankStack:
    """A :class:`RankStack` from a stack file's first line (``header``) and one dump."""
    main_ident = int(header[len(MAIN_THREAD) :], 16) if header.startswith(MAIN_THREAD) else None
    threads: list[ThreadStack] = []
    for line in dump.splitlines():
        if found := _THREAD.match(line):
            threads.append(ThreadStack(int(found.group(2), 16)))
        elif (frame := _FRAME.match(line)) and threads:
            threads[-1].frames.append(Frame(frame.group(1), int(frame.group(2)), frame.group(3)))
    for thread in threads:
        thread.frames = _in_the_worker(thread.frames)
    main = next((t for t in threads if t.ident == main_ident), None)
    return RankStack(rank, main, threads)


def _in_the_worker(frames: list[Frame]) -> list[Frame]:
    """``frames`` (innermost first) up to the worker's outermost own frame: older ones were
    inherited from the kernel by fork."""
    own = [i for i, f in enumerate(frames) if f.path.startswith(_WORKER_ROOTS)]
    return frames[: own[-1] + 1] if own else frames


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return -1


def wait_per_round(within_s: float | None) -> float:
    """How long :func:`take_stacks` waits in each round for the whole of it to take at most
    ``within_s`` seconds (``None``: :data:`STACK_WAIT_S` a round)."""
    return STACK_WAIT_S if within_s is None else within_s / _ROUNDS


def take_stacks(
    folder: str,
    pids: Mapping[int, int],
    wait_s: float = STACK_WAIT_S,
    collectives: bool = False,
) -> dict[int, RankStack]:
    """Every rank's stacks (rank -> pid in ``pids``), from the launch's ``folder``; a rank
    that cannot be asked or does not answer within ``wait_s`` is left out, and one whose dump
    is not whole by then is asked once more. With ``collectives``, each rank is then asked the
    last collective it entered (:attr:`RankStack.collective`).

    The collectives are asked for after the stacks are written, never during: the thread
    that answers would run while ``faulthandler`` reads its frames, which it does without the
    interpreter's lock, and a frame changing under it can leave the dump cut short."""
    stacks = _dump_stacks(folder, pids, wait_s)
    again = [
        rank
        for rank in pids
        if (rank not in stacks or not _whole(stacks[rank])) and not _ended(pids[rank])
    ]
    for rank, stack in _dump_stacks(folder, {r: pids[r] for r in again}, wait_s).items():
        if _whole(stack) or rank not in stacks:  # else what it wrote the first time
            stacks[rank] = stack
    if collectives:
        asked = [rank for rank in pids if _ask_collective(folder, rank)]
        found = _read_collectives(folder, asked, time.monotonic() + wait_s)
        for rank, collective in found.items():
            if rank in stacks:
                stacks[rank].collective = collective
    return stacks


def _dump_stacks(folder: str, pids: Mapping[int, int], wait_s: float) -> dict[int, RankStack]:
    """Signal each rank of ``pids`` and read the dump it writes, within ``wait_s``: whole, or
    what it wrote by then (a rank kept off the CPU while it writes, on a busy machine)."""
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
    stacks: dict[int, RankStack] = {}
    pending = set(starts)
    deadline = time.monotonic() + wait_s
    while pending and time.monotonic() < deadline:
        time.sleep(_POLL_S)  # the handler writes at once, in pieces: wait until it stops
        for rank in list(pending):
            if _ended(pids[rank]):  # it exited meanwhile (it was ending): it will not answer
                pending.discard(rank)
                continue
            size = _size(stack_file(folder, rank))
            if size > starts[rank] and seen.get(rank) == size:
                stacks[rank] = _read_dump(folder, rank, starts[rank])
                if _whole(stacks[rank]):
                    pending.discard(rank)
            seen[rank] = size
    for rank in pending:  # the deadline passed: what they wrote so far
        if seen.get(rank, starts[rank]) > starts[rank]:
            stacks[rank] = _read_dump(folder, rank, starts[rank])
    return stacks


def _ended(pid: int) -> bool:
    """Whether process ``pid`` has exited (gone, or a zombie not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rpartition(b")")[2].split()[0]
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        return False
    return state in (b"Z", b"X")


def _read_dump(folder: str, rank: int, begin: int) -> RankStack:
    """The dump ``rank`` wrote to its stack file from offset ``begin``."""
    with open(stack_file(folder, rank), encoding="utf-8", errors="replace") as stream:
        header = stream.readline().strip()
        stream.seek(begin)
        dump = stream.read()
    return parse_stacks(rank, header, dump)


def _whole(stack: RankStack) -> bool:
    """Whether a dump is written whole: its main thread (written last) reaches the worker's
    own frames, outside every frame of the user's. A pause of the writing rank (a busy
    machine) can make a dump look finished before it is."""
    if stack.main is None:
        return False
    frames = stack.main.frames
    return bool(frames) and frames[-1].path.startswith(_WORKER_ROOTS)


def abort_collectives(folder: str, ranks: list[int]) -> None:
    """Have ``ranks`` abort their collectives (an NCCL rank waiting for a failed peer is freed
    only so); a rank that is not listening is left as it is."""
    for rank in ranks:
        _request(folder, rank, ABORT)


def _ask_collective(folder: str, rank: int) -> bool:
    """Ask ``rank`` for its last collective; ``False`` when it is not listening."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(answer_file(folder, rank))  # an earlier answer
    return _request(folder, rank, ASK)


def _request(folder: str, rank: int, request: bytes) -> bool:
    """Write ``request`` to ``rank``'s pipe; ``False`` when nobody reads it now."""
    try:
        pipe = os.open(request_file(folder, rank), os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # no pipe (not started, or an old worker), or nobody reading it now
        return False
    try:
        os.write(pipe, request)
    except OSError:
        return False
    finally:
        os.close(pipe)
    return True


def _read_collectives(folder: str, ranks: list[int], deadline: float) -> dict[int, LastCollective]:
    """The answers of ``ranks`` that come by ``deadline`` (a rank that knows none is left
    out)."""
    answers: dict[int, LastCollective] = {}
    pending = set(ranks)
    while pending:
        for rank in list(pending):
            try:
                with open(answer_file(folder, rank), encoding="utf-8") as stream:
                    text = stream.read()
            except OSError:
                continue
            pending.discard(rank)
            if (found := LastCollective.from_json(text)) is not None:
                answers[rank] = found
        if pending and time.monotonic() >= deadline:
            break
        if pending:
            time.sleep(_POLL_S)
    return answers
