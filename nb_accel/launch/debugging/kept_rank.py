"""The rank that raised in a cold launch, kept after the launch for ``%debug``.

When a launch fails, the other ranks stop as usual; the rank of the root cause (its own
exception) waits instead, paused, with the frames where it raised
(:func:`~nb_accel.worker.debugging.post_mortem.wait_for_post_mortem`). :class:`KeptRank` is
the kernel's hold on it: :meth:`KeptRank.debug` opens the debugger there (its prompts in the
notebook), and :meth:`KeptRank.release` stops and reaps it. It is released when the post-mortem
ends, when the next launch or ``%%distributed`` cell starts, when another failure is kept, or
when the kernel exits; the worker also ends by itself once its wait (``post_mortem_wait``)
passes. Nothing of it outlives the kernel.
"""

from __future__ import annotations

import atexit
import shutil
import sys
from multiprocessing.connection import wait

from ..._messages import Debug, Output, Prompt, Stop, decode, encode_command
from ..launchers.stopping import EXIT_GRACE_S, stop_processes
from ..processes import WorkerProcess
from .prompts import answer_prompt

__all__ = ["KeptRank", "RankEndedError", "release_kept_rank"]


class RankEndedError(RuntimeError):
    """The rank kept for ``%debug`` ended before the debugger was opened on it."""


_held: dict[str, KeptRank] = {}

#: How long the kept rank has to show the debugger once asked (it waits idle for exactly
#: that: its first words take milliseconds); a rank that says nothing by then is stopped.
FIRST_WORDS_S = 30.0


class KeptRank:
    """A cold launch's rank that raised, waiting for ``%debug`` (see the module).

    Args:
        worker: its process, whose connection and output pipes are now the kept rank's.
        wait_s: how long it waits for the debugger (said when it ended first).
    """

    def __init__(self, worker: WorkerProcess, wait_s: float) -> None:
        self.worker = worker
        self.rank = worker.rank
        self._wait_s = wait_s
        self._released = False
        self._folders: list[str] = []
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
            if worker.poll() is not None:
                raise RankEndedError(
                    f"rank {rank} waited {self._wait_s:.0f} s for %debug and ended (the "
                    "saved setting post_mortem_wait says how long it waits)"
                )
            worker.conn.send_bytes(encode_command(Debug(cell=0, failed_cell=0)))
            self._serve(worker)
        finally:
            self.release()

    def _serve(self, worker: WorkerProcess) -> None:
        """Show what the debugger writes and answer its prompts until the worker exits."""
        first = True
        while True:
            ready = wait([worker.conn, worker.sentinel], FIRST_WORDS_S if first else None)
            if not ready:
                raise RankEndedError(
                    f"rank {self.rank} did not open the debugger within {FIRST_WORDS_S:.0f} s "
                    "of being asked (it was stuck after it raised); it has been stopped. Run "
                    "the failing launch again to inspect it anew"
                )
            first = False
            if worker.conn not in ready:
                return  # exited: nothing more can come
            try:
                event = decode(worker.conn.recv_bytes())
            except (EOFError, OSError):
                return
            if isinstance(event, Output):
                stream = sys.stdout if event.stream == "stdout" else sys.stderr
                stream.write(event.text)
                stream.flush()
            elif isinstance(event, Prompt):
                answer_prompt(event, sys.stdout.flush, worker.conn.send_bytes)

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
        if self._released:
            return
        self._released = True
        if _held.get("rank") is self:
            del _held["rank"]
        worker = self.worker
        try:
            if worker.poll() is None:
                try:
                    worker.conn.send_bytes(encode_command(Stop()))
                except OSError:
                    pass
                stop_processes([worker], EXIT_GRACE_S)  # it exits at Stop
            worker.reap()
        finally:
            worker.close()
            for folder in self._folders:
                shutil.rmtree(folder, ignore_errors=True)
            self._folders.clear()


def release_kept_rank() -> None:
    """Release the rank kept for ``%debug``, if any (a launch or cell is starting)."""
    held = _held.get("rank")
    if held is not None:
        held.release()
