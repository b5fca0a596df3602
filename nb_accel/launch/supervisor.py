"""Watching the worker processes of this machine: their events and exits together.

:class:`WorkerGroup` is the process side of this machine's ranks (a launch's and a pool's:
:mod:`~nb_accel.launch.pool_ranks.local`); the one driver
(:mod:`~nb_accel.launch.driver.driver`) runs their commands to the outcome. Each look blocks
on the workers' connections, their exit sentinels and the pipes of their file descriptors 1
and 2 (:mod:`.captured`) at once, so a result, an exception, a death or a line a library wrote
is seen the moment it happens; a worker's death is judged with the last words it wrote there
(NCCL's watchdog's, say). Whatever ends the launch (success, failure, KeyboardInterrupt),
:meth:`WorkerGroup.stop` leaves no process behind, and closes every pipe, connection and
process handle the group holds itself: nothing waits for the garbage collector.
"""

from __future__ import annotations

import select
import signal
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

from .._messages import Output, Prompt, TrackerRun, decode
from .debugging.kept_rank import KeptRank, waiting_note
from .debugging.post_mortems import in_ipython, offer_post_mortem
from .debugging.prompts import answer_prompt
from .failures.failure_log import FailureLog
from .failures.oom import oom_verdict
from .failures.verdict import died_failure, frozen_failure
from .failures.whereabouts import RankStack, take_stacks
from .launchers.dispatch import DispatchHooks, EventDispatcher
from .launchers.stopping import EXIT_GRACE_S, stop_processes, wait_exits
from .placement.short_commands import interrupt_deferred
from .processes import WorkerProcess
from .views.view import LaunchView

__all__ = ["WorkerGroup"]


class WorkerGroup(DispatchHooks):
    """The worker processes of one launch or pool on this machine, watched together.

    Their events go to an :class:`~nb_accel.launch.launchers.dispatch.EventDispatcher`
    (:attr:`events`); what a worker wrote to its file descriptors is shown before each change
    of its state.

    Args:
        workers: the started workers, one per rank, in rank order.
        on_output: called with each :class:`Output` event (stdout/stderr of a worker).
        timeout_s: the launch's collective timeout, quoted in timeout errors.
        view: told of starts, progress reports and failures as they arrive, and ticked about
            once a second.
        flush_output: called whenever the loop wakes; writes held-back output when due and
            returns the seconds until more is due (``None``: nothing held), which bounds the wait.
        folder: the launch's folder, where the workers write their stacks when asked.
        post_mortem_s: how long the rank that raised waits for ``%debug`` (0: it is stopped
            with the others); that rank is then kept past the launch
            (:class:`~nb_accel.launch.debugging.kept_rank.KeptRank`).
    """

    def __init__(
        self,
        workers: list[WorkerProcess],
        on_output: Callable[[Output], None],
        timeout_s: float,
        view: LaunchView | None = None,
        flush_output: Callable[[], float | None] | None = None,
        folder: str | None = None,
        post_mortem_s: float = 0.0,
    ) -> None:
        self.workers = workers
        self._folder = folder
        self._post_mortem_s = post_mortem_s
        self._kept: WorkerProcess | None = None
        #: The kernel's hold on the rank kept for ``%debug``, if one is.
        self.kept_rank: KeptRank | None = None
        self.events = EventDispatcher(on_output, view, self, flush_output)
        self._timeout_s = timeout_s
        self._exited: set[int] = set()
        self._ended_frozen: set[int] = set()  # frozen ranks the kernel ended itself
        self._open = {w.rank: w for w in workers}
        self._pollers: dict[int, select.poll] = {}
        self._stopped = False

    @property
    def world_size(self) -> int:
        """Number of ranks."""
        return len(self.workers)

    @property
    def _failures(self) -> FailureLog:
        return self.events.failures

    def before_change(self, sender: Any) -> None:
        """Show what ``sender`` (a worker) wrote to its file descriptors so far."""
        if isinstance(sender, WorkerProcess):
            self._read_captured(sender)

    def rank_of(self, sender: Any) -> int | None:
        """The rank of ``sender`` (a worker)."""
        return sender.rank if isinstance(sender, WorkerProcess) else None

    def other(self, event: Any, sender: Any) -> None:
        """A rank's prompt (``input()``, a breakpoint): asked in the notebook, answered."""
        if isinstance(event, Prompt) and isinstance(sender, WorkerProcess):
            flush = getattr(self.events.on_output, "flush", None)
            answer_prompt(event, flush or (lambda: None), sender.conn.send_bytes)

    def _drain(self, worker: WorkerProcess) -> None:
        """Read every event waiting on ``worker``'s connection; close it at end of stream."""
        try:
            waiting = self._pollers.get(worker.rank)
            if waiting is None:  # one poll object per connection, not a selector per event
                waiting = self._pollers[worker.rank] = select.poll()
                waiting.register(worker.conn.fileno(), select.POLLIN)
            while waiting.poll(0):
                self.events.handle(decode(worker.conn.recv_bytes()), worker)
        except (EOFError, OSError):
            self._open.pop(worker.rank, None)

    def _read_run_news(self, worker: WorkerProcess) -> None:
        """Read what ``worker`` sent before it was stopped, keeping only the news of its
        tracker runs (a run it ended on its way out is then not ended again)."""
        try:
            while worker.conn.poll():
                event = decode(worker.conn.recv_bytes())
                if isinstance(event, TrackerRun):
                    self.events.handle(event, worker)
        except (EOFError, OSError):
            pass

    def _read_captured(self, worker: WorkerProcess, fd: int | None = None) -> None:
        """Pass on what ``worker`` wrote to its file descriptors 1 and 2 (to ``fd`` only)."""
        captured = worker.captured
        if captured is not None:
            events = captured.read_all() if fd is None else captured.read(fd)
            for event in events:
                self.events.on_output(event)

    def _note_exit(self, worker: WorkerProcess) -> None:
        self._drain(worker)
        self._open.pop(worker.rank, None)
        self._exited.add(worker.rank)
        last_words = ""
        if worker.captured is not None:  # all the worker wrote is in the pipes by now
            for event in worker.captured.finish():
                self.events.on_output(event)
            last_words = worker.captured.last_words
        if worker.rank not in self.events.results and worker.rank not in self._failures.ranks:
            if worker.rank in self._ended_frozen:
                self._failures.add(frozen_failure(worker.rank, worker.pid))
                return
            oom_killed = oom_verdict(worker.oom_kills_at_start)
            self._failures.add(
                died_failure(worker.rank, worker.pid, worker.poll(), last_words, None, oom_killed)
            )

    def _watch_once(self, timeout: float | None) -> None:
        by_fd: dict[Any, WorkerProcess] = {}
        pipes: dict[int, WorkerProcess] = {}
        for worker in self.workers:
            if worker.rank in self._open:
                by_fd[worker.conn] = worker
            if worker.rank not in self._exited:
                by_fd[worker.sentinel] = worker
                if worker.captured is not None:
                    pipes.update(dict.fromkeys(worker.captured.fds, worker))
        if not by_fd:
            return
        if (due := self.events.wake()) is not None:
            timeout = due if timeout is None else min(timeout, due)
        ready = wait([*by_fd, *pipes], timeout)
        exits = [by_fd[r] for r in ready if isinstance(r, int) and r not in pipes]
        for item in ready:
            if isinstance(item, int) and item in pipes:
                self._read_captured(pipes[item], item)
            elif not isinstance(item, int):
                self._drain(by_fd[item])
        for worker in exits:
            if worker.poll() is not None:
                self._note_exit(worker)

    def keep_for_debugging(self, error: BaseException, ranks: list[int]) -> None:
        """Keep the first of ``ranks`` (the root cause's, which raised ``error``'s exception)
        waiting with its frames for ``%debug``, where the launch's workers wait for it
        (``post_mortem_s``) and it still runs; it is then not stopped with the others."""
        if self._post_mortem_s <= 0:
            return
        for rank in ranks[:1]:
            worker = self.workers[rank]
            if rank not in self._exited and worker.poll() is None:
                self._kept = worker
                kept = self.kept_rank = KeptRank(worker, self._post_mortem_s)
                offer_post_mortem(error, [rank], kept.debug, kept)
                if in_ipython() and hasattr(error, "add_note"):
                    error.add_note(waiting_note(rank, self._post_mortem_s))
                kept.let_go_unless_raised(error)
                return

    def frozen(self, ranks: list[int]) -> list[int]:
        """Those of ``ranks`` whose process is stopped (SIGSTOP, Ctrl-Z)."""
        return [r for r in ranks if r not in self._exited and self.workers[r].frozen()]

    def end_frozen(self, ranks: list[int]) -> None:
        """End the frozen ``ranks`` (SIGKILL: the only signal a stopped process takes); their
        death is recorded as a frozen rank's, not a kill's."""
        for rank in ranks:
            self._ended_frozen.add(rank)
            self.workers[rank].signal(signal.SIGKILL)

    def where(self, ranks: list[int]) -> dict[int, RankStack]:
        """Where each of ``ranks`` is: its stacks and its last collective, taken without
        stopping it; ranks that cannot say (ended, or frozen) are left out."""
        if self._folder is None:
            return {}
        frozen = set(self.frozen(ranks))
        pids = {
            rank: self.workers[rank].pid
            for rank in ranks
            if rank not in self._exited and rank not in frozen
        }
        return take_stacks(self._folder, pids, collectives=True)

    def stop(self, graceful: bool = False) -> None:
        """Stop every worker and reap it: SIGTERM, a short grace, then SIGKILL; then close
        every pipe, connection and process handle of the group, and let go of the dispatcher
        (which holds this group as its hooks), whatever interrupts the stopping.

        With ``graceful=True`` the workers are first given time to exit on their own.
        """
        if self._stopped:
            return
        self._stopped = True
        stopping = [w for w in self.workers if w is not self._kept]  # the kept one is its own
        try:
            try:
                if graceful:
                    wait_exits(stopping, EXIT_GRACE_S)
            finally:  # an interrupt ends the grace, never the stopping: none is left unreaped
                with interrupt_deferred():
                    stop_processes(stopping)
                    for worker in stopping:
                        worker.reap()
                        self._read_run_news(worker)
                        if worker.captured is not None and worker.rank not in self._exited:
                            for event in worker.captured.finish():  # its last words, if any
                                self.events.on_output(event)
                        worker.close()
        finally:
            for worker in stopping:
                worker.close()
            self._pollers.clear()
            self.events.close()
