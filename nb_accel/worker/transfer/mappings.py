"""Which memory a buffer lies in: only this process can write to a private anonymous mapping
(the heap, an anonymous ``mmap``), so write tracking of this process's page tables
(:mod:`.write_watch`) sees every write to it. A shared mapping (``share_memory_()``, a
``torch.multiprocessing`` queue's tensor, ``multiprocessing.shared_memory``, a ``/dev/shm`` or
any file's mapping) can also be written by another process, or through another mapping of the
same memory in this one, which no watch of this process's page tables sees."""

from __future__ import annotations

__all__ = ["MAPS", "only_this_process_writes"]

#: This process's mappings, a line each: ``start-end perms offset dev inode [path]``.
MAPS = "/proc/self/maps"

#: The names the kernel gives private anonymous mappings it made itself.
_ANONYMOUS_NAMES = ("[heap]", "[stack]")


def _private_anonymous(perms: str, inode: str, path: str) -> bool:
    if len(perms) < 4 or perms[3] != "p" or inode != "0":
        return False
    return not path or path in _ANONYMOUS_NAMES or path.startswith("[anon:")


def only_this_process_writes(address: int, nbytes: int) -> bool:
    """Whether every byte of ``nbytes`` at ``address`` lies in private anonymous mappings of
    this process (``False`` too when this process's mappings cannot be read)."""
    end = address + max(nbytes, 1)
    covered = address  # the ranges found so far reach up to here
    try:
        with open(MAPS) as maps:
            for line in maps:
                span, perms, _offset, _dev, inode, *rest = line.split(maxsplit=5)
                low, high = (int(part, 16) for part in span.split("-"))
                if high <= covered:
                    continue
                if low > covered:  # a hole: unmapped memory in the range
                    return False
                if not _private_anonymous(perms, inode, rest[0].strip() if rest else ""):
                    return False
                covered = high
                if covered >= end:
                    return True
    except (OSError, ValueError):
        return False
    return False
