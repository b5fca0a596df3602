"""Stopping a launch's worker processes: SIGTERM, a short grace, then SIGKILL.

Each worker leads its own process group, and the signals go to the group, so what a worker
started (DataLoader workers, say) is stopped with it.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Sequence
from multiprocessing.connection import wait
from typing import Protocol

__all__ = ["EXIT_GRACE_S", "STOP_GRACE_S", "Stoppable", "stop_processes", "wait_exits"]

#: Grace between SIGTERM and SIGKILL when stopping workers (seconds).
STOP_GRACE_S = 1.0
#: How long a worker that reported its result may take to exit on its own (seconds).
EXIT_GRACE_S = 5.0


class Stoppable(Protocol):
    """A worker process as the stop escalation sees it."""

    @property
    def sentinel(self) -> int:
        """A file descriptor that becomes readable when the process exits."""

    def poll(self) -> int | None:
        """The exit code, or ``None`` while it runs."""

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the process's group (to the process where there is none)."""


def wait_exits(processes: Sequence[Stoppable], grace: float) -> None:
    """Wait up to ``grace`` seconds for every process to exit."""
    deadline = time.monotonic() + grace
    while True:
        alive = [p for p in processes if p.poll() is None]
        remaining = deadline - time.monotonic()
        if not alive or remaining <= 0:
            return
        wait([p.sentinel for p in alive], remaining)


def stop_processes(
    processes: Sequence[Stoppable], exit_grace: float = 0.0, grace: float | None = None
) -> None:
    """Stop every process: wait ``exit_grace`` seconds for them to exit on their own, SIGTERM
    those still running (and SIGCONT, for a stopped one to act on it), wait
    :data:`STOP_GRACE_S` (or ``grace``), then SIGKILL."""
    if exit_grace > 0:
        wait_exits(processes, exit_grace)
    for process in processes:
        if process.poll() is None:
            process.signal(signal.SIGTERM)
            process.signal(signal.SIGCONT)  # a stopped process acts on the SIGTERM at once
    wait_exits(processes, STOP_GRACE_S if grace is None else grace)
    for process in processes:
        process.signal(signal.SIGKILL)  # reaches what it started, even once it has exited
