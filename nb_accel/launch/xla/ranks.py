"""An XLA launch's ranks: the worker processes ``xmp.spawn`` forked, run by the one driver.

The ranks report over one pipe; what each process writes to its file descriptors 1 and 2 comes
through pipes of its own (:class:`~.output.ProcessOutputs`) and is shown before any change of a
rank's state. The ranks run one command, the launch's function, and reply with its result or
failure (:mod:`~nb_accel.launch.driver.driver` runs it to its outcome); a rank that sent
neither is known dead once ``xmp.spawn`` has returned. Once the outcome is known the processes
still running are stopped (``xmp.spawn`` then returns) and heard out: their deaths, judged by
their exit codes and last words, join the failures.
"""

from __future__ import annotations

from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import Connection, wait
from typing import Any

from ..._messages import Failure, Output, Result, Started, decode
from ...errors import WorkerDiedError
from ...worker.transfer.pickling import Pickled
from ..failures.failure_log import FailureLog
from ..failures.whereabouts import RankStack
from ..launchers.dispatch import DispatchHooks, EventDispatcher
from ..launchers.outcome import RETURNED
from ..launchers.stopping import stop_processes
from ..pool_ranks.interface import CellOutput, PoolRanks, RankStatus, reply_of_outcome
from ..views.output import OutputPrinter
from ..views.view import LaunchView
from .output import ProcessOutputs
from .spawner import Spawner, new_children

__all__ = ["POLL_S", "REAP_S", "XlaRanks"]

#: How long stopped workers may take to be reaped by ``xmp.spawn`` (seconds).
REAP_S = 30.0
#: How often the watching loop looks whether ``xmp.spawn`` has returned (seconds).
POLL_S = 0.05


class XlaRanks(DispatchHooks, PoolRanks):
    """The ranks of one XLA launch.

    Args:
        outputs: the worker processes' file descriptors 1 and 2.
        printer: writes the workers' output; its view is the launch's.
        reader: the kernel's end of the workers' event pipe.
        spawner: the thread that runs ``xmp.spawn``.
        before: the kernel's child processes before the launch (the others are its workers).
        world_size: the ranks the launch runs.
    """

    keeps = False
    asked_where = False
    finished_as = RETURNED

    def __init__(
        self,
        outputs: ProcessOutputs,
        printer: OutputPrinter,
        reader: Connection,
        spawner: Spawner,
        before: set[int | None],
        world_size: int,
    ) -> None:
        self.output = CellOutput()
        self.output.printer = printer
        self._outputs = outputs
        self._reader = reader
        self._spawner = spawner
        self._before = before
        self._world_size = world_size
        self.events = EventDispatcher(printer, printer.view, self, printer.flush_due)
        self.cell = 0  # the function the ranks were started with
        self.done = {}

    # -- the dispatcher's hooks ---------------------------------------------------------

    def before_change(self, sender: Any) -> None:
        """Show what every worker process wrote so far."""
        self._show(self._outputs.read_all())

    def started(self, event: Started, sender: Any) -> None:
        """Note the process of the started rank."""
        self._outputs.started(event.rank, event.pid)

    def ended(self, event: Result | Failure) -> None:
        """A rank's reply to its command: its result, or its failure."""
        reply_of_outcome(self.done, self.cell, event)

    def rank_of(self, sender: Any) -> int | None:
        """Unknown: the ranks share one pipe."""
        return None

    def current(self, sender: Any) -> bool:
        """Always: an XLA launch is not restarted."""
        return True

    def other(self, event: Any, sender: Any) -> None:
        """Nothing else is expected from an XLA worker."""

    def _show(self, events: list[Output]) -> None:
        for event in events:
            self.output.printer(event)

    # -- the ranks ----------------------------------------------------------------------

    def _running(self) -> bool:
        return self._spawner.is_alive() or self._reader.poll(0)

    def watch(self, view: LaunchView | None, timeout: float | None) -> None:
        """Wait for the workers' events and output (or ``timeout``, at most :data:`POLL_S`:
        whether ``xmp.spawn`` returned is looked at that often) and handle them."""
        reader, outputs = self._reader, self._outputs
        wait_s = POLL_S if timeout is None else min(timeout, POLL_S)
        if (due := self.events.wake()) is not None:
            wait_s = min(wait_s, due)
        ready = wait([reader, *outputs.fds], max(wait_s, 0.0))
        for item in ready:
            if isinstance(item, int):
                self._show(outputs.read(item))
        if reader in ready:
            while reader.poll(0):
                self.events.handle(decode(reader.recv_bytes()))
        outputs.track()

    def dead_ranks(self) -> list[int]:
        """Once ``xmp.spawn`` has returned and every event is read: the ranks without a
        reply."""
        if self._running():
            return []
        return [rank for rank in range(self._world_size) if rank not in self.done]

    def collect_window(self, targets: list[int], dead: list[int]) -> float:
        """The failures' own window."""
        return self.events.failures.collect_window

    def command_failures(
        self, targets: list[int], stopped: list[int], view: LaunchView | None
    ) -> FailureLog:
        """The failures as they arrived, on the launch's view all along."""
        return self.events.failures

    def hear_out(self) -> None:
        """Stop the worker processes still running (``xmp.spawn`` then returns), read what
        they sent and wrote until then, and judge the deaths of those that never replied."""
        returned = all(
            rank in self.done and not self.done[rank].failure for rank in range(self._world_size)
        )
        if not returned and self._spawner.is_alive():
            stop_processes(new_children(self._before))
        while self._running():
            self.watch(None, POLL_S)
        self._show(self._outputs.finish())  # every worker has ended: this is all they wrote
        failures = self.events.failures
        results = [rank for rank, reply in self.done.items() if reply.failure is None]
        for record in self._outputs.deaths(results, failures.ranks):
            failures.add(record)

    def unexplained_end(self) -> BaseException | None:
        """``torch_xla`` itself failed (its own exception, as it raised it), or a worker
        process ended without reporting."""
        spawner = self._spawner
        if spawner.error is not None and not isinstance(spawner.error, BrokenProcessPool):
            return spawner.error
        ranks = sorted(rank for rank, reply in self.done.items() if reply.failure is None)
        if spawner.error is not None or spawner.exitcode or ranks != list(range(len(ranks))):
            how = f"exit code {spawner.exitcode}" if spawner.exitcode else f"{spawner.error!r}"
            how = self._outputs.unstarted() or how
            return WorkerDiedError(
                f"an XLA worker process ended without reporting ({how}); ranks that returned: "
                f"{ranks or 'none'}",
                [],
            )
        return None

    def died(self, world_size: int, timeout_s: float) -> BaseException:
        """The failures, else what :meth:`unexplained_end` says."""
        if self.events.failures:
            return self.events.failures.exception(world_size, {}, timeout_s)
        return self.unexplained_end() or WorkerDiedError(
            "the XLA workers ended without reporting a result", []
        )

    def send(self, rank: int, data: bytes) -> None:
        """Not possible: the XLA workers only report."""
        raise OSError("an XLA launch's workers take no commands")

    def interrupt(self, rank: int) -> None:
        """Nothing: an XLA launch's ranks are stopped, not interrupted."""

    def alive(self, rank: int) -> bool:
        """Whether ``xmp.spawn`` still runs the workers."""
        return self._spawner.is_alive()

    def note_exits(self) -> None:
        """Nothing: the deaths are judged once the workers are heard out."""

    def stacks(
        self, ranks: list[int], collectives: bool, within_s: float | None = None
    ) -> dict[int, RankStack]:
        """None: an XLA rank does not say where it is."""
        return {}

    def abort_collectives(self, ranks: list[int]) -> None:
        """Nothing: XLA collectives are not aborted from the kernel."""

    def status(self) -> list[RankStatus]:
        """None: an XLA launch is not a pool."""
        return []

    def seal(self, pickled: Pickled) -> bytes:
        """Big buffers inside the bytes."""
        return pickled.seal(None)

    def stop(self, graceful: bool = False) -> None:
        """Stop the workers still running, and wait for ``xmp.spawn`` to return (at most
        :data:`REAP_S`); show what they wrote last."""
        if self._spawner.is_alive():  # interrupted: stop the workers; xmp.spawn then returns
            stop_processes(new_children(self._before))
        if self._spawner.ident is not None:
            self._spawner.join(REAP_S)
        self._show(self._outputs.finish())  # an interrupted launch's last words
        self.events.close()
