"""Big buffers sent to the same workers again: written into shared memory once while unchanged.

Warm workers receive many commands from one kernel; a 400 MB tensor passed to every launch
would be written into shared memory each time. :class:`SentBuffers` gives each big buffer its
own segment file in the workers' folder and keeps it after the command, watched for writes
(:mod:`.write_watch`): the next command that sends the same memory, unwritten, names the same
file instead of writing another. A buffer written in any way since (an in-place ``add_``, a
NumPy view, a ``read()`` into it), or freed, is written again: the workers never see stale
bytes. Only buffers in memory no other process or mapping can write (private anonymous
mappings: :mod:`.mappings`) are kept; a buffer in shared memory (``share_memory_()``, a
``torch.multiprocessing`` queue's tensor, ``multiprocessing.shared_memory``, a ``/dev/shm``
memmap, a Hogwild model's parameters) is written every time, since a write through another
mapping of it is not seen. A segment is kept while its buffer is unchanged and alive in the
kernel, the least recently sent dropped first once the kept segments pass
:data:`KEEP_FRACTION` of the machine's memory; nothing is kept without write tracking
(:func:`~.write_watch.open_write_watch`).
"""

from __future__ import annotations

import dataclasses
import mmap
import os
from dataclasses import dataclass
from pickle import PickleBuffer

import numpy as np

from .mappings import only_this_process_writes
from .pickling import Pickled, Place, seal_placed, segments_of
from .segments import remove_segment, write_segment
from .write_watch import WriteWatch, open_write_watch

__all__ = ["KEEP_FRACTION", "SentBuffers", "keep_budget"]

#: The share of the machine's memory that kept segments may hold together.
KEEP_FRACTION = 0.25


def keep_budget() -> int:
    """How many bytes of kept segments :class:`SentBuffers` holds at most."""
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        memory = 8 << 30
    return int(memory * KEEP_FRACTION)


@dataclass(frozen=True)
class _Kept:
    """A buffer's segment, kept while the buffer's memory is unwritten.

    Attributes:
        address: where the buffer starts.
        nbytes: its size.
        head: its bytes before its first whole page (compared, not watched: other objects
            may share that page and write to it).
        tail: its bytes after its last whole page (likewise).
        path: the segment file.
    """

    address: int
    nbytes: int
    head: int
    tail: int
    path: str

    @property
    def pages(self) -> tuple[int, int]:
        """The whole pages of the buffer, which are watched: start and length."""
        return self.address + self.head, self.nbytes - self.head - self.tail


def _address_of(view: memoryview) -> int:
    """Where ``view``'s memory starts."""
    array = np.frombuffer(view, dtype=np.uint8)
    address = int(array.ctypes.data)
    del array  # no export of the view may outlive it
    return address


def _edges(address: int, nbytes: int) -> tuple[int, int]:
    """How many of the buffer's bytes lie before its first and after its last whole page."""
    head = min(-address % mmap.PAGESIZE, nbytes)
    tail = (address + nbytes) % mmap.PAGESIZE if nbytes > head else 0
    return head, min(tail, nbytes - head)


def _same_edges(kept: _Kept, view: memoryview) -> bool:
    """Whether the buffer's bytes outside its whole pages are those of its segment."""
    fd = os.open(kept.path, os.O_RDONLY)
    try:
        start_ok = os.pread(fd, kept.head, 0) == view[: kept.head]
        end = kept.nbytes - kept.tail
        return start_ok and os.pread(fd, kept.tail, end) == view[end:]
    finally:
        os.close(fd)


class SentBuffers:
    """The segments of the big buffers sent to one group of workers, through ``folder``.

    Args:
        folder: the workers' folder, which they map segments from.
        watch: whether to keep unchanged buffers' segments (write tracking permitting).
        budget: how many bytes the kept segments hold at most (:func:`keep_budget` if not
            given).
    """

    def __init__(self, folder: str, watch: bool = True, budget: int | None = None) -> None:
        self._folder = folder
        self._budget = keep_budget() if budget is None else budget
        self._want_watch = watch
        self._watch: WriteWatch | None = None
        self._kept: dict[tuple[int, int], _Kept] = {}  # the least recently sent first
        self._sealing: set[str] = set()  # the segments of the command being sealed

    def _write_watch(self) -> WriteWatch | None:
        if self._watch is None and self._want_watch:
            self._watch = open_write_watch()
            self._want_watch = self._watch is not None
        return self._watch

    def seal(self, pickled: Pickled) -> bytes:
        """The bytes that carry ``pickled`` to the workers: each big buffer in a segment of its
        own, the one kept from an earlier command where its memory is unchanged since."""
        self._sealing = set()
        places: list[Place] = [self._place(buffer) for buffer in pickled.buffers]
        return seal_placed(pickled.data, places)

    def _unchanged(self, kept: _Kept, view: memoryview) -> bool:
        watch = self._watch
        return (
            watch is not None
            and not (kept.pages[1] > 0 and watch.written(*kept.pages))
            and _same_edges(kept, view)
        )

    def _place(self, buffer: PickleBuffer) -> Place:
        with buffer.raw() as view:
            address, nbytes = _address_of(view), view.nbytes
            kept = self._kept.get((address, nbytes))
            if kept is not None and self._unchanged(kept, view):
                self._kept[(address, nbytes)] = self._kept.pop((address, nbytes))  # recent
                self._sealing.add(kept.path)
                return (kept.path, 0, nbytes)
        if kept is not None:
            self._drop(kept)
        watch = self._write_watch()
        fresh = _Kept(address, nbytes, *_edges(address, nbytes), path="")
        # Watched before it is copied: a write during or after the copy counts next time.
        # Memory another process or mapping could write is never kept: its writes go unseen.
        watched = (
            watch is not None
            and only_this_process_writes(address, nbytes)
            and (fresh.pages[1] == 0 or watch.watch(*fresh.pages))
        )
        written = write_segment(self._folder, [buffer])
        if written is None:  # no room: make some with the segments this command does not use
            for other in [k for k in self._kept.values() if k.path not in self._sealing]:
                self._drop(other)
            written = write_segment(self._folder, [buffer])
        if written is None:  # still no room: inside the bytes
            if watched and watch is not None:
                watch.forget(*fresh.pages)
            return buffer
        if watched:
            self._kept[(address, nbytes)] = dataclasses.replace(fresh, path=written[0])
        self._sealing.add(written[0])
        return (written[0], 0, nbytes)

    def _drop(self, kept: _Kept) -> None:
        del self._kept[(kept.address, kept.nbytes)]
        if self._watch is not None and kept.pages[1] > 0:
            self._watch.forget(*kept.pages)
        remove_segment(kept.path)

    def settle(self, data: bytes) -> None:
        """After a command's workers are done with ``data`` (what :meth:`seal` made): remove
        its segments that are not kept; drop the kept ones whose buffer changed or was freed
        since, then the least recently sent while they hold more than the budget."""
        used = set(segments_of(data))
        watch = self._watch
        for kept in list(self._kept.values()):
            if kept.path in used:
                continue
            if watch is None or (kept.pages[1] > 0 and watch.written(*kept.pages)):
                self._drop(kept)
        held = sum(k.nbytes for k in self._kept.values())
        for kept in list(self._kept.values()):  # the least recently sent first
            if held <= self._budget:
                break
            self._drop(kept)
            held -= kept.nbytes
        kept_paths = {k.path for k in self._kept.values()}
        for path in used - kept_paths:
            remove_segment(path)

    def close(self) -> None:
        """Remove every kept segment and stop watching; closing twice is fine."""
        for kept in list(self._kept.values()):
            self._drop(kept)
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        self._want_watch = False
