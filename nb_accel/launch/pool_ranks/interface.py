"""The pool's ranks, wherever they run: what :class:`~nb_accel.launch.pool.WorkerPool` needs
from them to send commands, hear the replies, interrupt, look inside and stop.

The pool decides what to send and when (commands, releases, settling after a failure); a
:class:`PoolRanks` carries it to the ranks and their events back: over pipes to processes of
this machine, or through each host's node process.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from ..._messages import CellDone, Event, Failure, Output, Prompt, Result
from ...errors import WorkerFailure
from ...worker.transfer.pickling import Pickled, segments_of
from ...worker.transfer.segments import remove_segment
from ..debugging.prompts import answer_prompt
from ..failures.failure_log import FailureLog
from ..failures.whereabouts import RankStack
from ..launchers.dispatch import EventDispatcher
from ..views.output import OutputPrinter
from ..views.view import LaunchView

__all__ = ["CellOutput", "PoolRanks", "RankStatus", "reply_of_outcome"]


@dataclass(frozen=True)
class RankStatus:
    """One rank of a pool, as ``%distributed status`` shows it.

    Attributes:
        rank: the rank.
        pid: its process id (on its host).
        alive: whether it runs.
        device: its device (``cpu``, ``cuda:0``).
        memory_mb: its resident memory (``None``: unknown).
        host: the host it runs on (``""``: this machine).
    """

    rank: int
    pid: int
    alive: bool
    device: str
    memory_mb: float | None
    host: str = ""


class CellOutput:
    """Where the workers' output goes: the current command's printer, for the one rank shown
    (every rank's when :attr:`shown` is ``None``; a rank's debugger is always shown: its user
    is at its prompt)."""

    def __init__(self) -> None:
        #: Writes the output of the current command.
        self.printer = OutputPrinter(1)
        #: The one rank whose output is shown (``None``: every rank's).
        self.shown: int | None = None

    def __call__(self, event: Output) -> None:
        """Write ``event`` if its rank is shown, or its debugger wrote it."""
        if self.shown is None or event.rank == self.shown or event.debugger:
            self.printer(event)

    def flush_due(self) -> float | None:
        """See :meth:`OutputPrinter.flush_due`."""
        return self.printer.flush_due()

    def flush(self) -> None:
        """See :meth:`OutputPrinter.flush`."""
        self.printer.flush()


def reply_of_outcome(done: dict[int, CellDone], cell: int, event: Result | Failure) -> None:
    """Keep a launched rank's result or failure in ``done`` as its reply to command ``cell``
    (a failure another rank relays for it counts too, as its first)."""
    if isinstance(event, Result):
        done[event.rank] = CellDone(event.rank, cell, value=event.data, at=event.at)
    elif event.rank not in done:
        done[event.rank] = CellDone(event.rank, cell, failure=event)


class PoolRanks(ABC):
    """A started pool's ranks and their events.

    Attributes:
        output: where the workers' output goes.
        events: the dispatcher of the workers' events (failures outside a command, progress).
        cell: the number of the current command.
        done: the current command's replies, by rank.
        place_of: names a rank's host for output prefixes (``None``: every rank is local).
    """

    output: CellOutput
    events: EventDispatcher
    cell: int
    done: dict[int, CellDone]
    place_of: Callable[[int], str] | None = None
    #: Whether a rank that died can be replaced by a new process (:meth:`replace`).
    replaces_dead_ranks: bool = False
    #: Whether the ranks outlive their command (warm workers, a pool); ``False``: they run one
    #: command, the function they were started with, and are stopped after it (a launch).
    keeps: bool = True
    #: What a rank that finished the command is said to have done, when another failed.
    finished_as: str = "finished the cell"
    #: Whether the ranks can be asked where they are while they run (:meth:`stacks`);
    #: ``False``: they never say (XLA), or only once they were stopped (a node's agent).
    asked_where: bool = True
    #: How long an interrupted launch waits to learn where its ranks were before it stops
    #: them (seconds: the user waits; a rank that cannot say by then is said not to have).
    interrupt_where_s: float = 1.0

    def collect_window(self, targets: list[int], dead: list[int]) -> float:
        """How long after the first failure of the current command to wait for the others'
        (:attr:`~nb_accel.launch.failures.failure_log.FailureLog.collect_window`; none after
        a death, which is a cause)."""
        if dead:
            return 0.0
        log = FailureLog()
        for rank in targets:
            if rank in self.done and (failure := self.done[rank].failure) is not None:
                log.add_event(failure)
        return log.collect_window

    def command_failures(
        self, targets: list[int], stopped: list[int], view: LaunchView | None
    ) -> FailureLog:
        """The current command's failures, shown on ``view``: how each dead rank died, then
        the failures the ``targets`` replied with, in the order they arrived (but the
        interrupts of the ``stopped`` ranks, freed after another's failure)."""
        log = FailureLog(view)  # the root cause shown failed, its knock-on failures stopped
        dead = self.dead_ranks()
        records: list[WorkerFailure] = list(self.events.failures.records)
        for record in records:
            if record.rank in dead:
                log.add(record)
        for reply in self.done.values():  # in the order they arrived
            if reply.failure is not None and reply.rank not in stopped:
                log.add_event(reply.failure)
        return log

    def restarting(self) -> bool:
        """Whether the ranks are being restarted after a failure (torch's elastic agents do,
        within ``max_restarts``): their failures so far are not the command's outcome."""
        return False

    def hear_out(self) -> None:
        """The command's outcome is known: have the ranks that are stopped after it end, and
        take in what they report meanwhile (a death their host's agent noticed last). Kept
        ranks, and ranks the kernel hears directly, need not."""
        return None

    def unexplained_end(self) -> BaseException | None:
        """Once the ranks are heard out, what went wrong without a failure of any rank (a
        host's node ended on a problem, the process that ran the ranks raised); ``None``:
        nothing did."""
        return None

    def add_history(self, error: BaseException, failures: FailureLog) -> None:
        """Add to the command's ``error`` what the ranks went through before the attempt
        that ended with ``failures`` (restarts, and what caused each)."""
        del error, failures

    def keep_for_debugging(self, error: BaseException, ranks: list[int]) -> None:
        """Where the ranks are stopped after their command: keep the first of ``ranks`` (those
        that raised ``error``'s exceptions) waiting with its frames, for ``%debug``. Kept
        ranks need not: the post-mortem is a command of theirs."""
        del error, ranks

    def frozen(self, ranks: list[int]) -> list[int]:
        """Those of ``ranks`` whose process is stopped (SIGSTOP, Ctrl-Z): they can neither say
        where they are nor take an interrupt. Ranks whose state the kernel cannot see (on other
        machines) are never said to be."""
        del ranks
        return []

    def out_of_reach(self, ranks: list[int]) -> dict[int, str]:
        """Those of ``ranks`` the kernel lost contact with (their host's connection ended while
        they ran), each with what is known, in words (``was out of reach: ...``). Ranks on this
        machine never are."""
        del ranks
        return {}

    def elsewhere(self) -> dict[int, str]:
        """The ranks of the launch that this kernel does not run (a multi-node launch's other
        nodes' ranks), each with where it is, in words (``is on node 1, ...``): said of them,
        unless they failed, instead of what the kernel cannot know. Here: none."""
        return {}

    def end_frozen(self, ranks: list[int]) -> None:
        """End the frozen ``ranks`` (after another rank's failure, the others cannot wait for
        them): their death then tells that they were frozen."""
        del ranks

    def take_reply(self, event: Event) -> None:
        """Keep ``event`` if it is a reply to the current command; answer a rank's debugger
        prompt with the line typed in the notebook."""
        if isinstance(event, Prompt):
            answer_prompt(event, self.output.printer.flush, partial(self.send, event.rank))
            return
        if isinstance(event, CellDone) and event.cell == self.cell:
            self.done[event.rank] = event
            if event.failure is None:
                self.events.view.returned(event.rank)

    @abstractmethod
    def send(self, rank: int, data: bytes) -> None:
        """Write ``data`` (one pickled message) to ``rank``; ``OSError`` when it is gone."""

    @abstractmethod
    def interrupt(self, rank: int) -> None:
        """Send ``rank`` the kernel's interrupt (SIGINT)."""

    @abstractmethod
    def alive(self, rank: int) -> bool:
        """Whether ``rank`` still runs (as far as the kernel has heard)."""

    @abstractmethod
    def note_exits(self) -> None:
        """Notice ranks that have ended since the last command (killed between cells)."""

    @abstractmethod
    def dead_ranks(self) -> list[int]:
        """Ranks that have ended (or reported a failure outside a command)."""

    @abstractmethod
    def watch(self, view: LaunchView | None, timeout: float | None) -> None:
        """Wait for events (or ``timeout``) and handle them, telling ``view``."""

    @abstractmethod
    def stacks(
        self, ranks: list[int], collectives: bool, within_s: float | None = None
    ) -> dict[int, RankStack]:
        """Where each of ``ranks`` is (and its last collective, with ``collectives``); ranks
        that cannot say within a second are left out. With ``within_s``, the answer comes
        within that many seconds at most, whoever has not said by then left out (an
        interrupt's: the user waits)."""

    @abstractmethod
    def abort_collectives(self, ranks: list[int]) -> None:
        """Have ``ranks`` abort the collective they wait in (NCCL; see
        :func:`~nb_accel.launch.failures.whereabouts.abort_collectives`)."""

    @abstractmethod
    def status(self) -> list[RankStatus]:
        """Every rank's :class:`RankStatus`."""

    @abstractmethod
    def died(self, world_size: int, timeout_s: float) -> BaseException:
        """The exception that says which ranks died, and how."""

    @abstractmethod
    def seal(self, pickled: Pickled) -> bytes:
        """The bytes of ``pickled`` that reach every rank (big buffers shared where the ranks
        can map them)."""

    def settle(self, data: bytes) -> None:
        """After a command that sent ``data`` (what :meth:`seal` made) is over: remove the
        shared-memory segments it named, which no rank maps any more."""
        for segment in segments_of(data):
            remove_segment(segment)

    def replace(self, ranks: list[int], joins_at: int) -> list[int]:
        """Start a new process in place of each of ``ranks`` (which died), joining the other
        ranks' process group as they make it anew at command ``joins_at``; the new pids.
        Only where :attr:`replaces_dead_ranks` says so."""
        raise NotImplementedError

    def take_new_ranks(self) -> list[int]:
        """The ranks :meth:`replace` started anew since the last call (forgotten here): the
        pool asks the others which of their variables these lack."""
        return []

    @abstractmethod
    def stop(self, graceful: bool) -> None:
        """Stop every rank (they were sent ``Stop``; with ``graceful`` they get time to end
        on their own) and release what the ranks hold."""
