"""Shared-memory segments: the big buffers of one pickled object, written once into a file of a
launch's private folder (in ``/dev/shm`` where the machine has one) and mapped copy-on-write by
every process that loads them.

A segment is a plain file: the buffers one after the other, each at a page-aligned offset. A
process that loads it maps the whole file ``MAP_PRIVATE``: reading costs no copy and the pages
are shared with every other process that maps them; a write copies only the page written, for
that process alone. The file may be removed as soon as the last process has mapped it (the
mappings stay valid); whatever is left is removed with the launch's folder.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from collections.abc import Sequence
from pickle import PickleBuffer

__all__ = [
    "INLINE_ENV",
    "SCRATCH_FREE_BYTES",
    "SHARE_DIR_ENV",
    "SHARE_MIN_BYTES",
    "Span",
    "map_segment",
    "remove_segment",
    "segment_dir",
    "share_dir",
    "shared_root",
    "write_segment",
]

#: Buffers at least this big travel through a segment; smaller ones travel in the pickle.
SHARE_MIN_BYTES = 1 << 20

#: Where segments go when the machine has a shared-memory file system.
SHM_ROOT = "/dev/shm"

#: The environment variable that names, in a worker, the launch's folder for its segments.
SHARE_DIR_ENV = "NB_ACCEL_SHARE_DIR"

#: The environment variable that, set to ``"1"`` in a worker, has its big buffers travel inside
#: its messages: its kernel runs on another machine and cannot map this one's files.
INLINE_ENV = "NB_ACCEL_INLINE_BUFFERS"

#: Free space a segment leaves on its file system (a full ``/dev/shm`` breaks other programs).
_SPARE_BYTES = 64 << 20
#: Free space ``/dev/shm`` must have for a launch's folder to go there (the folder's own small
#: files: each rank's stacks, the prompt clock); with less, the temporary folder holds it.
SCRATCH_FREE_BYTES = 1 << 20

#: One buffer in a segment: its offset and its length in bytes.
Span = tuple[int, int]


def shared_root() -> str:
    """The folder under which launches keep their segments: ``/dev/shm`` when it exists, is
    writable and has room (:data:`SCRATCH_FREE_BYTES`: memory, never the disk), else the
    temporary folder (a full ``/dev/shm`` would fail the ranks' first writes there)."""
    if os.path.isdir(SHM_ROOT) and os.access(SHM_ROOT, os.W_OK | os.X_OK):
        if _free_bytes(SHM_ROOT) >= SCRATCH_FREE_BYTES:
            return SHM_ROOT
    return tempfile.gettempdir()


def share_dir() -> str | None:
    """The folder this worker writes its segments to (its launch's), or ``None``."""
    return os.environ.get(SHARE_DIR_ENV) or None


def segment_dir() -> str | None:
    """Where this worker writes the segments of what it sends its kernel: its launch's folder,
    or ``None`` when its kernel is on another machine (:data:`INLINE_ENV`)."""
    if os.environ.get(INLINE_ENV) == "1":
        return None
    return share_dir()


def _layout(buffers: Sequence[PickleBuffer]) -> tuple[list[Span], int]:
    spans: list[Span] = []
    offset = 0
    for buffer in buffers:
        with memoryview(buffer) as view:
            size = view.nbytes
        spans.append((offset, size))
        offset += -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
    return spans, offset


def _free_bytes(folder: str) -> int:
    """The space free for this user on ``folder``'s file system (0 where it cannot be read)."""
    try:
        stats = os.statvfs(folder)
    except OSError:
        return 0
    return stats.f_bavail * stats.f_frsize


def _fits(folder: str, size: int) -> bool:
    return _free_bytes(folder) >= size + _SPARE_BYTES


def write_segment(folder: str, buffers: Sequence[PickleBuffer]) -> tuple[str, list[Span]] | None:
    """Write ``buffers`` (contiguous: pickle's out-of-band buffers) into a new segment file in
    ``folder``.

    Returns its path and where each buffer sits, or ``None`` when they do not fit (the caller
    sends them another way); nothing is left behind then.
    """
    spans, size = _layout(buffers)
    if not _fits(folder, size):
        return None
    fd, path = tempfile.mkstemp(prefix="buffers-", dir=folder)
    try:
        for buffer, (offset, length) in zip(buffers, spans, strict=True):
            with memoryview(buffer) as whole, whole.cast("B") as view:
                written = 0
                while written < length:  # one write moves at most about 2 GB
                    written += os.pwrite(fd, view[written:], offset + written)
    except OSError:
        os.close(fd)
        remove_segment(path)
        return None
    os.close(fd)
    return path, spans


def map_segment(path: str) -> memoryview:
    """Map the segment at ``path`` copy-on-write: a writable view of the whole file.

    The mapping lives as long as any view of it (or any object built on one) does.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        mapped = mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    return memoryview(mapped)


def remove_segment(path: str) -> None:
    """Remove the segment file at ``path`` (mappings of it stay valid); gone already is fine."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
