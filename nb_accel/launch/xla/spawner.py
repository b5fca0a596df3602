"""``xmp.spawn`` run off the kernel's main thread, and the worker processes it forks.

The kernel's main thread watches the workers while :class:`Spawner` waits for ``xmp.spawn``;
an interrupted launch stops the processes ``xmp.spawn`` forked (:class:`ForkedWorker`, as the
shared stop escalation sees them), after which ``xmp.spawn`` returns.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import Any

__all__ = ["ForkedWorker", "Spawner"]


class Spawner(threading.Thread):
    """Runs ``xmp.spawn`` off the kernel's main thread, which watches the workers meanwhile.

    With one process, ``xmp.spawn(nprocs=1)`` would run the function in the calling process,
    so it runs in a child forked here instead: the kernel never touches the XLA device.
    """

    def __init__(
        self, xmp: Any, target: Callable[..., None], args: tuple[Any, ...], nprocs: int | None
    ) -> None:
        super().__init__(name="nb_accel-xla-spawn", daemon=True)
        self._xmp = xmp
        self._target = target
        self._args = args
        self._nprocs = nprocs
        self.error: BaseException | None = None
        self.exitcode: int | None = None

    def run(self) -> None:
        """Spawn the workers and wait for them; keep what went wrong for the kernel."""
        try:
            if self._nprocs == 1:
                child = multiprocessing.get_context("fork").Process(
                    target=_spawn_one,
                    args=(self._xmp, self._target, self._args),
                    name="nb_accel-xla-worker",
                )
                child.start()
                child.join()
                self.exitcode = child.exitcode
            else:
                self._xmp.spawn(self._target, args=self._args, start_method="fork")
        except BaseException as error:  # noqa: BLE001 - examined by the launching thread
            self.error = error


def _spawn_one(xmp: Any, target: Callable[..., None], args: tuple[Any, ...]) -> None:
    xmp.spawn(target, args=args, nprocs=1, start_method="fork")


class ForkedWorker:
    """A worker process ``xmp.spawn`` forked (a child of the kernel), as
    :func:`~nb_accel.launch.launchers.stopping.stop_processes` sees it; one that has exited is
    never signalled (``xmp.spawn`` may have reaped it already)."""

    def __init__(self, process: BaseProcess) -> None:
        self._process = process

    @property
    def sentinel(self) -> int:
        """Readable once the process has exited."""
        return self._process.sentinel

    def poll(self) -> int | None:
        """The exit code, or ``None`` while it runs."""
        return self._process.exitcode

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the process's group (to the process where that fails)."""
        pid = self._process.pid
        if pid is None or self._process.exitcode is not None:
            return
        try:
            os.killpg(pid, signum)
        except OSError:
            try:
                os.kill(pid, signum)
            except OSError:
                pass


def new_children(before: set[int | None]) -> list[ForkedWorker]:
    """The kernel's child processes that are not in ``before`` (pids): the workers."""
    return [ForkedWorker(c) for c in multiprocessing.active_children() if c.pid not in before]
