"""The rank that raised in a cold launch, kept after the launch for ``%debug``.

When a launch fails, the other ranks stop as usual; the rank of the root cause (its own
exception) waits instead, paused, with the frames where it raised
(:func:`~nb_accel.worker.debugging.post_mortem.wait_for_post_mortem`). :class:`KeptRank` is
the kernel's hold on it: :meth:`KeptRank.debug` opens the debugger there (its prompts in the
notebook), and :meth:`KeptRank.release` stops and reaps it. It is released when the post-mortem
ends, when the next launch or ``%%distributed`` cell starts, when another failure is kept, or
when the kernel exits; the worker also ends by itself once its wait (``post_mortem_wait``)
passes. Nothing of it outlives the kernel.

Where the rank runs is behind :class:`HeldProcess`: a worker process of this machine
(:class:`LocalProcess`), or a worker on a host reached through its node process (the hosts'
own, in :mod:`~nb_accel.launch.hosts`).
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import sys
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any, Protocol

from ..._messages import Debug, Event, Output, Prompt, Stop, decode, encode_command
from ..launchers.stopping import EXIT_GRACE_S, stop_processes
from ..processes import WorkerProcess
from .prompts import answer_prompt

__all__ = [
    "HeldProcess",
    "KeptRank",
    "LocalProcess",
    "RankEndedError",
    "release_kept_rank",
    "waiting_note",
]


class RankEndedError(RuntimeError):
    """The rank kept for ``%debug`` ended before the debugger was opened on it."""


_held: dict[str, KeptRank] = {}

#: How long the kept rank has to show the debugger once asked (it waits idle for exactly
#: that: its first words take milliseconds); a rank that says nothing by then is stopped.
FIRST_WORDS_S = 30.0


def waiting_note(rank: int, wait_s: float) -> str:
    """What the error of a launch whose rank ``rank`` is kept for ``%debug`` says of the wait
    (``wait_s``: how long the rank waits)."""
    minutes = f"{wait_s / 60:g} min" if wait_s >= 60 else f"{wait_s:g} s"
    return (
        f"Rank {rank} waits for it up to {minutes} (the saved setting post_mortem_wait), "
        "holding its memory; it is let go at the end of this cell if the error is caught "
        "there, and by the next launch or cell."
    )


class HeldProcess(Protocol):
    """The kept rank's process, wherever it runs: the kernel's one way to it."""

    #: The rank it runs.
    rank: int

    def ended(self) -> bool:
        """Whether the process has ended."""

    def send(self, data: bytes) -> None:
        """Send the encoded command ``data`` to the rank (``OSError``: it has gone)."""

    def receive(self, timeout: float | None) -> Event | None:
        """The rank's next event, waiting up to ``timeout`` (``None`` when none came);
        ``EOFError`` once the process has ended."""

    def stop(self) -> None:
        """Stop the process (it was told :class:`Stop` first) and close what the kernel
        holds of it; twice is fine."""


class LocalProcess:
    """A worker process of this machine as the kept rank's process.

    Args:
        worker: the process, whose connection and output pipes are now the kept rank's.
    """

    def __init__(self, worker: WorkerProcess) -> None:
        self.worker = worker
        self.rank = worker.rank

    def ended(self) -> bool:
        """Whether the worker has exited."""
        return self.worker.poll() is not None

    def send(self, data: bytes) -> None:
        """On the worker's connection."""
        self.worker.conn.send_bytes(data)

    def receive(self, timeout: float | None) -> Event | None:
        """From the worker's connection (its exit ends them)."""
        worker = self.worker
        ready = wait([worker.conn, worker.sentinel], timeout)
        if not ready:
            return None
        if worker.conn not in ready:
            raise EOFError  # exited: nothing more can come
        try:
            return decode(worker.conn.recv_bytes())
        except OSError:
            raise EOFError from None

    def stop(self) -> None:
        """SIGTERM after a short grace, then SIGKILL; reaped and closed."""
        worker = self.worker
        try:
            if worker.poll() is None:
                stop_processes([worker], EXIT_GRACE_S)  # it exits at Stop
            worker.reap()
        finally:
            worker.close()


class KeptRank:
    """A cold launch's rank that raised, waiting for ``%debug`` (see the module).

    Args:
        worker: its process: one of this machine's (a :class:`WorkerProcess`), or any
            :class:`HeldProcess`.
        wait_s: how long it waits for the debugger (said when it ended first).
    """

    def __init__(self, worker: WorkerProcess | HeldProcess, wait_s: float) -> None:
        held = LocalProcess(worker) if isinstance(worker, WorkerProcess) else worker
        self.worker: HeldProcess = held
        self.rank = held.rank
        self._wait_s = wait_s
        self._released = False
        self._folders: list[str] = []
        self._after_the_cell: Callable[[Any], None] | None = None
        release_kept_rank()  # one at a time: the previous failure's goes
        _held["rank"] = self
        atexit.register(self.release)

    def debug(self, rank: int) -> None:
        """Open the debugger on the kept rank's frames and answer its prompts until it ends;
        the rank is released then."""
        if self._released:
            raise RankEndedError(
                f"rank {rank} no longer waits for %debug: its post-mortem has ended, or a later "
                "launch or cell let it go; run the failing launch again to inspect it anew"
            )
        worker = self.worker
        try:
            if worker.ended():
                raise RankEndedError(
                    f"rank {rank} waited {self._wait_s:.0f} s for %debug and ended (the "
                    "saved setting post_mortem_wait says how long it waits)"
                )
            try:
                worker.send(encode_command(Debug(cell=0, failed_cell=0)))
            except OSError:
                raise RankEndedError(
                    f"rank {rank} ended before the debugger opened (its host's connection "
                    "ended); run the failing launch again to inspect it anew"
                ) from None
            self._serve(worker)
        finally:
            self.release()

    def _serve(self, worker: HeldProcess) -> None:
        """Show what the debugger writes and answer its prompts until the worker exits."""
        first = True
        while True:
            try:
                event = worker.receive(FIRST_WORDS_S if first else None)
            except EOFError:
                return  # exited: nothing more can come
            if event is None:
                raise RankEndedError(
                    f"rank {self.rank} did not open the debugger within {FIRST_WORDS_S:.0f} s "
                    "of being asked (it was stuck after it raised); it has been stopped. Run "
                    "the failing launch again to inspect it anew"
                )
            first = False
            if isinstance(event, Output):
                stream = sys.stdout if event.stream == "stdout" else sys.stderr
                stream.write(event.text)
                stream.flush()
            elif isinstance(event, Prompt):
                answer_prompt(event, sys.stdout.flush, worker.send)

    def let_go_unless_raised(self, error: BaseException) -> None:
        """In IPython: once the cell that ran the launch ends, let the rank go unless that
        cell ended with ``error`` (then ``%debug`` can reach it); an error the cell caught, or
        another one, leaves nothing waiting."""
        shell = _shell()
        if shell is None:
            return

        def after_the_cell(result: Any) -> None:
            self._forget_the_cell()
            if getattr(result, "error_in_exec", None) is not error:
                self.release()

        self._after_the_cell = after_the_cell
        shell.events.register("post_run_cell", after_the_cell)

    def _forget_the_cell(self) -> None:
        after, self._after_the_cell = self._after_the_cell, None
        shell = _shell()
        if after is not None and shell is not None:
            with contextlib.suppress(ValueError):  # not registered any more
                shell.events.unregister("post_run_cell", after)

    def remove_with_it(self, folder: str) -> None:
        """Remove ``folder`` when the rank is released, not before (the launch's folder: the
        rank's process group keeps using the store in it)."""
        if self._released:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            self._folders.append(folder)

    def release(self) -> None:
        """Stop and reap the kept rank and close what the kernel holds of it; twice is fine."""
        atexit.unregister(self.release)
        self._forget_the_cell()
        if self._released:
            return
        self._released = True
        if _held.get("rank") is self:
            del _held["rank"]
        worker = self.worker
        try:
            if not worker.ended():
                with contextlib.suppress(OSError):
                    worker.send(encode_command(Stop()))
            worker.stop()
        finally:
            for folder in self._folders:
                shutil.rmtree(folder, ignore_errors=True)
            self._folders.clear()


def _shell() -> Any:
    """The IPython shell this kernel runs, or ``None``."""
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None


def release_kept_rank() -> None:
    """Release the rank kept for ``%debug``, if any (a launch or cell is starting)."""
    held = _held.get("rank")
    if held is not None:
        held.release()
