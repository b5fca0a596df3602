"""The connections of this rank's gloo process group, and how the rank frees its own thread
from a gloo collective past its deadline.

A thread waiting inside a gloo collective returns when the collective completes, when one of
its connections fails, or at the deadline torch gave it. Aborting the process group from
another thread does not wake it: the waiting collective holds the group's connections open. A
rank that keeps its collective deadline itself
(:mod:`~nb_accel.worker.debugging.deadline`) therefore notes which connected TCP sockets its
process group opened (those new between just before the group was made and just after its
first barrier) and, past the deadline, shuts them down: the wait fails at once, as it would
had a peer's process gone, and so do the peers' waits with this rank. The group is unusable
afterwards and is made anew (a persistent pool's workers rebuild it before their next command).
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat

__all__ = [
    "connected_tcp_sockets",
    "forget_group_sockets",
    "note_group_sockets",
    "shut_down_group_sockets",
]

_FD_FOLDER = "/proc/self/fd"

#: A socket as noted: its descriptor, and the (device, inode) that tell it from a later socket
#: given the same descriptor number.
_Noted = tuple[int, tuple[int, int]]

#: The current process group's connections (none noted: empty).
_noted: list[frozenset[_Noted]] = []


def _open_tcp(fd: int) -> socket.socket | None:
    """A duplicate of ``fd`` when it is a TCP socket connected to a peer (a listening socket
    is not), else ``None``; the caller closes it."""
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            return None
        duplicate = os.dup(fd)
    except OSError:
        return None
    try:
        probe = socket.socket(fileno=duplicate)
    except OSError:
        os.close(duplicate)
        return None
    try:
        if probe.family in (socket.AF_INET, socket.AF_INET6):
            probe.getpeername()
            return probe
    except OSError:
        pass
    probe.close()
    return None


def _identity(connection: socket.socket) -> tuple[int, int]:
    found = os.fstat(connection.fileno())
    return found.st_dev, found.st_ino


def _connected() -> frozenset[_Noted]:
    try:
        names = os.listdir(_FD_FOLDER)
    except OSError:
        return frozenset()
    found = set()
    for name in names:
        if not name.isdigit() or (connection := _open_tcp(int(name))) is None:
            continue
        with connection:
            found.add((int(name), _identity(connection)))
    return frozenset(found)


def connected_tcp_sockets() -> frozenset[int]:
    """The file descriptors of this process's connected TCP sockets (none where the system
    does not list a process's descriptors)."""
    return frozenset(fd for fd, _ in _connected())


def note_group_sockets(before: frozenset[int]) -> None:
    """Note the process group just made: its connections are the connected TCP sockets that
    are new since ``before`` (what :func:`connected_tcp_sockets` said just before it was
    made)."""
    _noted[:] = [frozenset(found for found in _connected() if found[0] not in before)]


def forget_group_sockets() -> None:
    """The noted process group is gone: its descriptors may be reused by anything."""
    _noted.clear()


def shut_down_group_sockets() -> int:
    """Shut down the noted process group's connections (see the module); how many were. Only
    a descriptor that is still the same connected TCP socket is touched (a descriptor number
    reused by another socket is not)."""
    count = 0
    for fd, identity in sorted(_noted[0]) if _noted else ():
        connection = _open_tcp(fd)
        if connection is None:
            continue
        with connection:
            if _identity(connection) != identity:
                continue
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
                count += 1
    return count
