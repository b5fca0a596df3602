"""The agent's workers as this node's stop sees them: children of the agent's process that
torch reaps itself. They are looked at without being reaped (torch reads their exit codes
afterwards), and only signalled while they are still this process's own children, so that a
pid torch has reaped (and the system may have given to another process) is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal

from ..launchers.stopping import stop_processes
from ..processes import process_frozen

__all__ = ["UnreapedChild", "continue_children", "ended_unreaped", "stop_children"]


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
