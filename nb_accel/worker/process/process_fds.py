"""A forked worker process's file descriptors 1 and 2 made the pipes its launch reads.

The kernel makes one pair of pipes per worker process before it forks the workers (an XLA
launch, whose processes ``xmp.spawn`` forks: ``nb_accel.launch.xla.output``), and installs
their ends here with :func:`set_process_pipes`; every forked worker inherits them all. A worker
calls :func:`write_to_process_pipes` with its process's index: its file descriptors 1 and 2
become its own pair's write ends, and it closes every other end it inherited (the other
processes' pipes, the kernel's read ends). What C++ libraries, ``os.write``, programs it starts
and ``faulthandler`` write there then reaches the kernel, which reads the pipes, so nothing
written just before an abort is lost.

A process may run several ranks, one thread each (TPU v2/v3): every rank thread calls
:func:`write_to_process_pipes`, and only the first call of a process redirects.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from .fd_forwarder import faulthandler_to_stderr

__all__ = ["ProcessPipes", "set_process_pipes", "write_to_process_pipes"]


@dataclass(frozen=True)
class ProcessPipes:
    """The pipes of a launch's worker processes, as file descriptors of the kernel.

    Attributes:
        write_ends: for each process index, the write ends of its ``(stdout, stderr)`` pipes.
        read_ends: the kernel's read ends of every pipe (a worker closes its copies).
    """

    write_ends: tuple[tuple[int, int], ...]
    read_ends: tuple[int, ...]

    def every_end(self) -> list[int]:
        """Every file descriptor named here."""
        return [fd for pair in self.write_ends for fd in pair] + list(self.read_ends)


_pipes: ProcessPipes | None = None
_lock = threading.Lock()
_redirected = False


def set_process_pipes(pipes: ProcessPipes | None) -> None:
    """Install (or, with ``None``, forget) the pipes the next forked workers write to."""
    global _pipes  # noqa: PLW0603 - one launch at a time per kernel
    _pipes = pipes


def write_to_process_pipes(process_index: int) -> bool:
    """Make this process's file descriptors 1 and 2 the write ends of process
    ``process_index``'s pipes and close the other inherited ends; once per process.

    Returns ``True`` when this call redirected them: ``False`` when an earlier call (another
    rank thread of this process) did, when no pipes are installed, when the launch made none
    for this index or when they cannot be used (the descriptors are left as they are).
    """
    global _redirected  # noqa: PLW0603 - once per process, whichever rank thread comes first
    with _lock:
        pipes = _pipes
        if _redirected or pipes is None or not 0 <= process_index < len(pipes.write_ends):
            return False
        _redirected = True
        try:
            for target, fd in zip((1, 2), pipes.write_ends[process_index], strict=True):
                os.dup2(fd, target)
        except OSError:  # the launch's pipes are gone: the output goes where it went
            return False
        for fd in pipes.every_end():
            try:
                os.close(fd)
            except OSError:
                pass
        faulthandler_to_stderr()
        return True
