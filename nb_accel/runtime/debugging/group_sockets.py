"""The connections of this rank's gloo process group, and how the rank frees its own thread
from a gloo collective past its deadline.

A thread waiting inside a gloo collective returns when the collective completes, when one of
its connections fails, or at the deadline torch gave it. Aborting the process group from
another thread does not wake it: the waiting collective holds the group's connections open. A
rank that keeps its collective deadline itself
(:mod:`~nb_accel.runtime.debugging.deadline`) therefore notes which connected TCP sockets its
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

#: The file descriptors of the current process group's connections (none noted: empty).
_noted: list[frozenset[int]] = []


def _connected_tcp(fd: int) -> bool:
    """Whether ``fd`` is a TCP socket connected to a peer (a listening socket is not)."""
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            return False
        probe = socket.socket(fileno=os.dup(fd))
    except OSError:
        return False
    try:
        if probe.family not in (socket.AF_INET, socket.AF_INET6):
            return False
        probe.getpeername()
        return True
    except OSError:
        return False
    finally:
        probe.close()


def connected_tcp_sockets() -> frozenset[int]:
    """The file descriptors of this process's connected TCP sockets (none where the system
    does not list a process's descriptors)."""
    try:
        names = os.listdir(_FD_FOLDER)
    except OSError:
        return frozenset()
    return frozenset(int(name) for name in names if name.isdigit() and _connected_tcp(int(name)))


def note_group_sockets(before: frozenset[int]) -> None:
    """Note the process group just made: its connections are the connected TCP sockets that
    are new since ``before`` (what :func:`connected_tcp_sockets` said just before it was
    made)."""
    _noted[:] = [connected_tcp_sockets() - before]


def forget_group_sockets() -> None:
    """The noted process group is gone: its descriptors may be reused by anything."""
    _noted.clear()


def shut_down_group_sockets() -> int:
    """Shut down the noted process group's connections (see the module); how many were. Only
    descriptors that are still connected TCP sockets are touched."""
    count = 0
    for fd in sorted(_noted[0]) if _noted else ():
        if not _connected_tcp(fd):
            continue
        with contextlib.suppress(OSError):
            connection = socket.socket(fileno=os.dup(fd))
            try:
                connection.shutdown(socket.SHUT_RDWR)
                count += 1
            finally:
                connection.close()
    return count
