"""The agent's workers as this node's stop sees them: children of the agent's process that
torch reaps itself. They are looked at without being reaped (torch reads their exit codes
afterwards), and only signalled while they are still this process's own children, so that a
pid torch has reaped (and the system may have given to another process) is never signalled.

One case is the other way round: torch's agent starts a node's workers one after the other and
keeps them only once the last has started, its own handler of the kernel's interrupt (and of a
stop) installed just before. Interrupted in between, its stop finds nothing to stop, and the
workers already started would run on, or end as zombies nothing reaps:
:func:`reap_started_since` stops and reaps them, through :mod:`multiprocessing`'s record of
each where it has one (so that its record stays true), by their pids otherwise.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal

from ..launchers.stopping import stop_processes
from ..processes import process_frozen

__all__ = [
    "UnreapedChild",
    "child_pids",
    "continue_children",
    "ended_unreaped",
    "reap_started_since",
    "stop_children",
]


def _waited(pid: int) -> os.waitid_result | bool | None:
    """``pid``'s end, looked at without reaping it: its ``waitid`` result, ``None`` while it
    runs, ``False`` when it is no child of this process (any more)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False


def ended_unreaped(pid: int) -> bool | None:
    """Whether the child process ``pid`` has ended on a failure (not exit code 0), looked at
    without reaping it; ``None`` while it runs (or if it is no child of this process)."""
    info = _waited(pid)
    if not info:
        return None
    assert isinstance(info, os.waitid_result)
    return not (info.si_code == os.CLD_EXITED and info.si_status == 0)


class UnreapedChild:
    """A child process of this one, stopped without being reaped (see the module)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._fd: int | None = None

    @property
    def sentinel(self) -> int:
        """A descriptor that becomes readable when the process ends (a pidfd, opened on first
        use and closed by :meth:`close`)."""
        if self._fd is None:
            self._fd = os.pidfd_open(self.pid)
        return self._fd

    def poll(self) -> int | None:
        """``None`` while it runs; ``0`` once it has ended (or is no child of this one)."""
        return None if _waited(self.pid) is None else 0

    def signal(self, signum: int) -> None:
        """Send ``signum`` to it (and to the group it leads), while it is this one's child."""
        if _waited(self.pid) is False:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(self.pid) == self.pid:
                os.killpg(self.pid, signum)
            else:
                os.kill(self.pid, signum)

    def close(self) -> None:
        """Close its pidfd."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def continue_children(pids: list[int]) -> None:
    """Continue those of the children ``pids`` that are frozen (stopped: SIGSTOP, Ctrl-Z), so
    that they act on the signal they are about to get."""
    for pid in pids:
        if _waited(pid) is None and process_frozen(pid):
            UnreapedChild(pid).signal(signal.SIGCONT)


def stop_children(pids: list[int]) -> None:
    """Stop the children ``pids`` that still run as every launch stops its ranks (SIGTERM,
    with SIGCONT for a frozen one; :data:`a short grace; SIGKILL), none of them reaped."""
    children = [UnreapedChild(pid) for pid in pids if _waited(pid) is None]
    if not children:
        return
    try:
        stop_processes(children)
    finally:
        for child in children:
            child.close()


def child_pids() -> set[int]:
    """The process ids of this process's children (started by any of its threads)."""
    pids: set[int] = set()
    with contextlib.suppress(OSError):
        for task in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError), open(f"/proc/self/task/{task}/children") as listed:
                pids.update(int(pid) for pid in listed.read().split())
    return pids


def reap_started_since(before: set[int]) -> None:
    """Kill and reap every child of this process that is not among ``before``."""
    known = {process.pid: process for process in multiprocessing.active_children()}
    for pid in child_pids() - before:
        process = known.get(pid)
        if process is not None:
            process.kill()
            process.join()
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
