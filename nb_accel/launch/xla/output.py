"""The file descriptors 1 and 2 of an XLA launch's worker processes, and the deaths they explain.

``xmp.spawn`` forks the workers, one process per TPU chip, so the kernel cannot hand each its
pipes as it starts it. Instead :class:`ProcessOutputs` makes one
:class:`~nb_accel.launch.captured.CapturedOutput` per worker *process* (not per rank) before the
launch; every worker inherits them all and makes its own pair its file descriptors 1 and 2
(:mod:`nb_accel.worker.process.process_fds`). What the TPU runtime's C++ code, ``os.write``,
programs a worker starts and ``faulthandler`` write there reaches the cell, prefixed with the
process's rank.

The kernel keeps its copies of the write ends until the launch is over (``xmp.spawn`` forks
whenever it chooses, so they must stay open to be inherited): a pipe's end is never awaited;
once every worker has exited, what is left in the pipes is all they wrote, and
:meth:`ProcessOutputs.finish` sends it. A process that died without reporting (killed by
``SIGABRT`` after an ``F... Check failed`` line, say) is explained with what it wrote last to
its stderr, as a single-node launch explains its workers' deaths.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import signal
from collections.abc import Iterable
from multiprocessing.process import BaseProcess

from ..._messages import Output
from ...errors import WorkerFailure
from ...worker.process.process_fds import ProcessPipes
from ..captured import CapturedOutput
from ..failures.verdict import died_failure, rank_list

__all__ = ["ProcessOutputs"]


class ProcessOutputs:
    """The pipes of an XLA launch's worker processes, read by the kernel without blocking.

    Process ``i`` runs ranks ``i * ranks_per_process`` to ``(i + 1) * ranks_per_process - 1``
    (torch_xla numbers a host's ranks process by process). Its output is shown as its *first*
    rank's: a process of several rank threads (TPU v2/v3, one per TensorCore) has one pair of
    file descriptors, written by both threads and by the runtime, so its lines carry that one
    rank (``[rank 2]`` for the process of ranks 2 and 3).

    Made before the workers are forked; it also notes which of the kernel's child processes
    are new (the workers), to tell how each ended.

    Args:
        processes: worker processes of the launch.
        ranks_per_process: ranks each process runs, one thread each.
        world_size: ranks in the launch.
    """

    def __init__(self, processes: int, ranks_per_process: int, world_size: int) -> None:
        self.ranks_per_process = max(1, ranks_per_process)
        self.world_size = world_size
        self._before = {child.pid for child in multiprocessing.active_children()}
        self.captured = [
            CapturedOutput(index * self.ranks_per_process) for index in range(max(1, processes))
        ]
        self._owner = {fd: captured for captured in self.captured for fd in captured.fds}
        self._pids: dict[int, int] = {}  # process index -> pid
        self._children: dict[int, BaseProcess] = {}  # pid -> the kernel's child process

    def pipes(self) -> ProcessPipes:
        """The pipes' file descriptors, as the forked workers find them."""
        return ProcessPipes(
            write_ends=tuple(captured.write_fds for captured in self.captured),
            read_ends=tuple(self._owner),
        )

    @property
    def fds(self) -> list[int]:
        """The read ends still open (to wait on)."""
        return [fd for captured in self.captured for fd in captured.fds]

    def read(self, fd: int) -> list[Output]:
        """Read what waits on ``fd``: its complete lines as events."""
        captured = self._owner.get(fd)
        return captured.read(fd) if captured is not None else []

    def read_all(self) -> list[Output]:
        """Read what waits on every pipe."""
        return [event for captured in self.captured for event in captured.read_all()]

    def finish(self) -> list[Output]:
        """Read what is left, unfinished lines too, and close every pipe (the workers have
        exited; what a program they started writes later is not read)."""
        return [event for captured in self.captured for event in captured.finish()]

    def close(self) -> None:
        """Close every pipe end the kernel still holds."""
        for captured in self.captured:
            captured.close()

    def started(self, rank: int, pid: int) -> None:
        """``rank`` runs in process ``pid`` (its ``Started`` event)."""
        self._pids.setdefault(rank // self.ranks_per_process, pid)
        self.track()

    def track(self) -> None:
        """Note the kernel's new child processes (the workers), to read their exit codes once
        they have ended (``xmp.spawn`` reaps them)."""
        for child in multiprocessing.active_children():
            if child.pid is not None and child.pid not in self._before:
                self._children.setdefault(child.pid, child)

    def _exitcode(self, pid: int) -> int | None:
        child = self._children.get(pid)
        return child.exitcode if child is not None else None

    def _ranks(self, index: int) -> list[int]:
        first = index * self.ranks_per_process
        return [r for r in range(first, first + self.ranks_per_process) if r < self.world_size]

    def deaths(self, returned: Iterable[int], failed: Iterable[int]) -> list[WorkerFailure]:
        """A record for every process that ended without reporting all its ranks, with the
        end of what it wrote to its stderr (call after :meth:`finish`).

        A process one of whose ranks reported a failure is not one (it ended itself
        afterwards), nor, when another failure explains the launch's end, a process killed by
        ``SIGTERM`` (``xmp.spawn`` ends the other processes when one has died).

        Args:
            returned: the ranks that reported a result.
            failed: the ranks that reported a failure.
        """
        returned, failed = set(returned), set(failed)
        found: list[WorkerFailure] = []
        for index, captured in enumerate(self.captured):
            ranks = self._ranks(index)
            unreported = [r for r in ranks if r not in returned]
            pid = self._pids.get(index)
            if pid is None or not unreported or failed.intersection(ranks):
                continue
            exitcode = self._exitcode(pid)
            if exitcode is None:
                continue
            record = died_failure(unreported[0], pid, exitcode, captured.last_words)
            if len(unreported) > 1:
                record = dataclasses.replace(
                    record,
                    message=record.message.replace(
                        f"worker for rank {unreported[0]} ",
                        f"worker process of {rank_list(unreported)} ",
                        1,
                    ),
                )
            found.append(record)
        explained = (
            failed
            or self._unstarted_codes()
            or any(record.exitcode != -signal.SIGTERM for record in found)
        )
        if explained:
            found = [record for record in found if record.exitcode != -signal.SIGTERM]
        return found

    def _unstarted_codes(self) -> dict[int, int]:
        """pid -> exit code of the processes whose ranks never started and that ended badly
        (``SIGTERM`` aside: ``xmp.spawn`` ends the others that way when one has died)."""
        started = set(self._pids.values())
        codes: dict[int, int] = {}
        for pid, child in sorted(self._children.items()):
            code = child.exitcode
            if pid not in started and code and code != -signal.SIGTERM:
                codes[pid] = code
        return codes

    def unstarted(self) -> str:
        """How the worker processes whose ranks never started ended (``"pid 812 was killed by
        SIGABRT ..."``), or ``""``: they died while torch_xla set up the device, before they
        could make the pipes their file descriptors, so what they wrote went to the kernel's
        own."""
        ended = [f"pid {pid} {_ended(code)}" for pid, code in self._unstarted_codes().items()]
        if not ended:
            return ""
        return (
            f"{'; '.join(ended)} while torch_xla set up its devices, before its ranks started; "
            "the XLA runtime's message is in the kernel's own log (the Jupyter server's output)"
        )


def _ended(exitcode: int) -> str:
    """How a process ended, in words (``"was killed by SIGABRT"``, ``"exited with code 1"``)."""
    if exitcode >= 0:
        return f"exited with code {exitcode}"
    try:
        return f"was killed by {signal.Signals(-exitcode).name}"
    except ValueError:
        return f"was killed by signal {-exitcode}"
