"""A pool's ranks on this machine: worker processes the kernel started, one pipe each.

Commands go down each worker's event connection and the kernel's interrupt is a SIGINT; the
workers' stacks and big buffers go through the pool's folder (in ``/dev/shm``), which every
rank maps.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal

from ..._messages import Event
from ...worker.process.pool_worker import serve
from ...worker.transfer.pickling import Pickled
from ...worker.transfer.sent_buffers import SentBuffers
from ..debugging.prompts import prompt_clock
from ..failures.whereabouts import RankStack, abort_collectives, take_stacks, wait_per_round
from ..payload import LaunchPayload, launch_payload
from ..plan import LaunchPlan
from ..processes import WorkerProcess, multiprocessing_helpers, resident_mb
from ..scratch import make_scratch_dir
from ..supervisor import WorkerGroup
from ..views.view import LaunchView
from ..workers import start_workers
from .interface import CellOutput, PoolRanks, RankStatus

__all__ = ["LocalRanks", "start_local_ranks"]


class LocalRanks(WorkerGroup, PoolRanks):
    """The pool's worker processes on this machine.

    A rank that dies is replaced by a new process (:meth:`replace`).

    Args:
        workers: the started workers, in rank order.
        plan: the pool's plan.
        folder: the pool's folder (its store, stacks and shared buffers).
        helpers: what the start method holds open (closed when the ranks stop).
        payload: what every worker runs (the command loop), for the ranks started later.
        clock: the pool's prompt clock file.
        view: the launch view told of the ranks' events (a pool's is each command's).
        post_mortem_s: how long a launch's rank that raised waits for ``%debug``
            (:meth:`~nb_accel.launch.supervisor.WorkerGroup.keep_for_debugging`).
    """

    replaces_dead_ranks = True

    def __init__(
        self,
        workers: list[WorkerProcess],
        plan: LaunchPlan,
        folder: str,
        helpers: contextlib.ExitStack,
        payload: LaunchPayload | None = None,
        clock: str = "",
        view: LaunchView | None = None,
        post_mortem_s: float = 0.0,
    ) -> None:
        self.output = CellOutput()
        super().__init__(
            workers,
            self.output,
            plan.timeout_s,
            view,
            flush_output=self.output.flush_due,
            folder=folder,
            post_mortem_s=post_mortem_s,
        )
        self._plan = plan
        self._store = folder
        self._helpers = helpers
        self._payload = payload
        self._clock = clock
        self._sent = SentBuffers(folder)
        self.done = {}
        self.cell = -1
        self._new_ranks: list[int] = []  # replaced since the pool last asked

    def other(self, event: Event, sender: object) -> None:
        """Keep the current command's replies."""
        self.take_reply(event)

    def _drain(self, worker: WorkerProcess) -> None:
        """Read ``worker``'s waiting events with SIGINT held back: an interrupt must not land in
        the middle of a message (the rest would be read as the next one)."""
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            super()._drain(worker)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)

    def send(self, rank: int, data: bytes) -> None:
        """Write ``data`` to ``rank``'s connection."""
        self.workers[rank].conn.send_bytes(data)

    def interrupt(self, rank: int) -> None:
        """SIGINT to ``rank``'s process."""
        with contextlib.suppress(OSError):
            os.kill(self.workers[rank].pid, signal.SIGINT)

    def alive(self, rank: int) -> bool:
        """Whether ``rank``'s process runs."""
        return self.workers[rank].poll() is None

    def note_exits(self) -> None:
        """Notice workers that have exited since the last command (e.g. killed between cells)."""
        for worker in self.workers:
            if worker.rank not in self._exited and worker.poll() is not None:
                self._note_exit(worker)

    def dead_ranks(self) -> list[int]:
        """Ranks whose worker has exited (or reported a failure outside a command)."""
        return sorted(self._failures.ranks | self._exited)

    def watch(self, view: LaunchView | None, timeout: float | None) -> None:
        """Wait for events (or ``timeout``) and handle them."""
        self.events.set_view(view)
        self._watch_once(timeout)

    def stacks(
        self, ranks: list[int], collectives: bool, within_s: float | None = None
    ) -> dict[int, RankStack]:
        """Every rank's stacks, from the pool's folder."""
        frozen = set(self.frozen(ranks))  # a stopped process cannot say: not asked
        pids = {
            r: self.workers[r].pid
            for r in ranks
            if self.workers[r].poll() is None and r not in frozen
        }
        wait_s = wait_per_round(within_s)
        return take_stacks(self._store, pids, wait_s, collectives=collectives)

    def abort_collectives(self, ranks: list[int]) -> None:
        """Through the pool's folder."""
        abort_collectives(self._store, ranks)

    def status(self) -> list[RankStatus]:
        """Pid, liveness, device and resident memory of every worker."""
        device = self._plan.device
        return [
            RankStatus(
                rank=w.rank,
                pid=w.pid,
                alive=w.poll() is None,
                device=str(device.rank_device(w.rank)),
                memory_mb=resident_mb(w.pid) if w.poll() is None else None,
            )
            for w in self.workers
        ]

    def replace(self, ranks: list[int], joins_at: int) -> list[int]:
        """Start a new worker in place of each of ``ranks`` (dead, reaped here); they join
        the others' process group as it is made anew at command ``joins_at``. The failures
        noted so far (the deaths) are forgotten."""
        assert self._payload is not None, "a pool's ranks know their payload"
        for rank in ranks:
            self.workers[rank].reap()
            self.workers[rank].close()
        started: list[WorkerProcess] = []
        try:
            start_workers(
                self._plan, self._store, self._payload, started, self._clock, ranks, joins_at
            )
        finally:
            for worker in started:  # stopped with the others whatever happens next
                self.workers[worker.rank] = worker
                self._open[worker.rank] = worker
                self._exited.discard(worker.rank)
                self._pollers.pop(worker.rank, None)
        self.events.new_attempt()
        self._new_ranks.extend(worker.rank for worker in started)
        return [worker.pid for worker in started]

    def take_new_ranks(self) -> list[int]:
        """The ranks replaced since the last call."""
        new, self._new_ranks = sorted(set(self._new_ranks)), []
        return new

    def died(self, world_size: int, timeout_s: float) -> BaseException:
        """The dead ranks' failures, as one exception."""
        return self._failures.exception(world_size, {}, timeout_s)

    def seal(self, pickled: Pickled) -> bytes:
        """Big buffers written once into the pool's folder; one the last command sent
        already, unwritten since, is not written again (:class:`SentBuffers`)."""
        return self._sent.seal(pickled)

    def settle(self, data: bytes) -> None:
        """Remove the segments of ``data`` that are not kept for the next command."""
        self._sent.settle(data)

    def stop(self, graceful: bool = False) -> None:
        """Stop and reap every worker, then remove the ranks' folder (once the rank kept for
        ``%debug`` is let go, if one is: its process group's store is in it, and torch's file
        store waits out the timeout on every use once its file is gone)."""
        if self._stopped:
            return
        try:
            super().stop(graceful=graceful)
        finally:
            self._sent.close()
            if self.kept_rank is not None:
                self.kept_rank.remove_with_it(self._store)
            else:
                shutil.rmtree(self._store, ignore_errors=True)
            self._helpers.close()


def start_local_ranks(plan: LaunchPlan) -> LocalRanks:
    """Start ``plan.num_processes`` workers serving the pool's commands on this machine."""
    helpers = contextlib.ExitStack()
    helpers.enter_context(multiprocessing_helpers(plan.start_method))
    folder = make_scratch_dir("pool")
    clock = helpers.enter_context(prompt_clock(folder))  # prompts leave the ranks' timeout
    workers: list[WorkerProcess] = []
    try:
        payload = launch_payload(serve, (), {}, plan.start_method == "fork")
        start_workers(plan, folder, payload, workers, clock)
    except BaseException:
        LocalRanks(workers, plan, folder, helpers).stop()
        raise
    return LocalRanks(workers, plan, folder, helpers, payload, clock)
