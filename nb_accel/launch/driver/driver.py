"""The one place a command runs on ranks to its outcome, wherever the ranks live.

Every way of running ranks comes here: a cold launch (its function is the command its ranks
were started with, and they are stopped after it), a warm launch and a ``%%distributed`` cell
(commands sent to kept ranks). The ranks are a
:class:`~nb_accel.launch.pool_ranks.interface.PoolRanks`: processes of this machine, or ranks on
hosts driven through their node processes. :class:`RankDriver` waits for every rank's reply;
after the first failure it gives the others the failures' window to arrive, then deals with
the ranks still running (kept ranks are freed and keep their namespaces: see
:mod:`~nb_accel.launch.pool_ranks.late`; ranks that are stopped after the command are located
first, for the error to say where they were); it answers the kernel's interrupt; it gives the
verdict (:func:`~nb_accel.launch.launchers.outcome.failure_outcome`), offers the post-mortem,
and replaces a kept rank that died. Whether the ranks outlive the command is the ranks' to say
(:attr:`~nb_accel.launch.pool_ranks.interface.PoolRanks.keeps`); the rest is written once.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
from collections.abc import Callable, Mapping, Sequence

from ..._messages import CellDone, Command, Debug, Release, Settle, encode_command
from ...errors import LaunchError, WorkerDiedError
from ..debugging.post_mortems import offer_post_mortem, raising_ranks
from ..debugging.prompts import prompts_shown, prompts_since
from ..failures.verdict import rank_list
from ..failures.whereabouts import RankStack, stacks_note, where_lines
from ..launchers.outcome import failure_outcome
from ..placement.short_commands import interrupt_deferred
from ..pool_ranks.interface import PoolRanks
from ..pool_ranks.late import (
    LateRanks,
    free_late,
    recheck_late,
    send_interrupts,
    stuck_interrupt,
)
from ..pool_ranks.notes import REBUILT_NOTE, STOPPED_NOTE, replaced_note
from ..pool_ranks.values import discard_values, load_value
from ..views.output import OutputPrinter
from ..views.stall import Location, locating
from ..views.view import LaunchView, NullView

__all__ = ["INTERRUPT_GRACE_S", "RankDriver", "checked_targets"]

#: How long interrupted ranks (by the user, or as another failed) may take to stop (seconds).
INTERRUPT_GRACE_S = 10.0


class RankDriver:
    """Runs commands on one started set of ranks, one at a time, each to its outcome.

    Args:
        ranks: the ranks, started.
        world_size: how many there are.
        timeout_s: the collective timeout, quoted in timeout errors and given to a
            :class:`~nb_accel._messages.Settle`.
        detached_collectives: whether a rank's collectives run apart from its code (NCCL's):
            those of a rank freed after another's failure are aborted too.
        give_up: stops the ranks for good, given why (a kept rank died, or did not stop after
            an interrupt); the driver raises the error that says so next.
    """

    def __init__(
        self,
        ranks: PoolRanks,
        world_size: int,
        timeout_s: float,
        detached_collectives: bool,
        give_up: Callable[[str], None],
    ) -> None:
        self.ranks = ranks
        self.world_size = world_size
        self._timeout_s = timeout_s
        self._detached = detached_collectives
        self._give_up = give_up
        self._cell = 0
        self._unsettled = False  # a command failed or was interrupted since the last Settle
        self._debugging = False  # the command running is a post-mortem
        self._replacing = False  # dead ranks are being replaced (a death now gives up)
        self._given_up = False  # the ranks were stopped for good
        self._waiting_for: list[int] = []  # the ranks the current command was sent to
        self._late = LateRanks()  # the current command's ranks freed after another's failure
        #: The ranks that had returned when the current command's first failure was seen
        #: (``None`` before it): a rank that returns after it was still running then.
        self._returned_first: set[int] | None = None
        self._prompts_from = prompts_shown()  # those shown since are the current command's
        #: The current command's view.
        self.view: LaunchView = NullView()

    # -- the ranks' first command: a cold launch's function ------------------------------

    def run_started(
        self, view: LaunchView, targets: list[int] | None = None
    ) -> dict[int, CellDone] | BaseException:
        """Wait for the command the ranks were started with (a launch's function: command 0)
        to end on ``targets`` (every rank; a node's, in a launch over several nodes each
        driven from its own kernel); their replies by rank, or the exception for its
        failures."""
        group = self.ranks
        targets = list(range(self.world_size)) if targets is None else targets
        self._waiting_for, self.view, self._late = targets, view, LateRanks()
        self._returned_first = None
        try:
            self._wait(group, targets, view, None)
        except KeyboardInterrupt as interrupt:
            self._interrupted(group, targets, view, interrupt)
            raise
        return self._outcome(group, targets, view)

    # -- commands sent to kept ranks ----------------------------------------------------

    def run(
        self,
        make_command: Callable[[int], Command | Settle],
        targets: list[int],
        *,
        all_output: bool = False,
        prefix_output: bool = True,
        view: LaunchView | None = None,
    ) -> dict[int, CellDone]:
        """Send ``make_command(cell)`` to ``targets`` and wait until each has done it.

        Output of the first target (of every target with ``all_output``) is written as it
        arrives. A failure on any rank is raised in the kernel as for a launch (original type,
        ranks named, identical failures grouped) and the ranks stay up. The process group
        is remade first after a failure, unless the command opens the debugger (its frames
        are those of the failure: the group is remade for the next command).
        """
        if self._unsettled and not self._debugging:
            self._settle()
        group = self.ranks
        self._cell += 1
        group.cell, group.done = self._cell, {}
        output = group.output
        output.printer.flush()  # anything printed between two commands
        printer = OutputPrinter(
            len(targets) if all_output else 1, prefix_output, view=view, place_of=group.place_of
        )
        output.printer, output.shown = printer, None if all_output else targets[0]
        data = encode_command(make_command(self._cell))
        try:
            # Every target is sent the command, or none is: an interrupt that comes meanwhile
            # waits until all are, then stops it on every rank like any interrupt during it.
            with interrupt_deferred():
                self._send(group, targets, data)
                self._waiting_for, self.view, self._late = targets, printer.view, LateRanks()
                self._returned_first = None
                self._prompts_from = prompts_shown()
            self._wait(group, targets, printer.view, None)
        except KeyboardInterrupt as interrupt:
            self._interrupted(group, targets, printer.view, interrupt)
            raise
        finally:
            printer.flush()  # what the command printed, before its outcome is told
        outcome = self._outcome(group, targets, printer.view)
        if isinstance(outcome, BaseException):
            try:
                raise outcome
            finally:  # the traceback keeps this frame: it must not hold the error
                del outcome
        return outcome

    def _send(self, group: PoolRanks, targets: list[int], data: bytes) -> None:
        """Send the command ``data`` to each of ``targets``."""
        for rank in targets:
            try:
                group.send(rank, data)
            except OSError:  # the worker has just died: say so (once the others are done)
                group.note_exits()
                if not group.replaces_dead_ranks or self._replacing:
                    self._died()

    def wait(self) -> dict[int, CellDone] | BaseException:
        """Wait until every rank the current command went to has done it; their replies by
        rank, or the exception for the command's failures."""
        self.check_alive(note_exits=False)
        self._wait(self.ranks, self._waiting_for, self.view, None)
        return self._outcome(self.ranks, self._waiting_for, self.view)

    def debug(self, rank: int, failed_cell: int) -> None:
        """Open the debugger on rank ``rank``'s frames where command ``failed_cell`` raised,
        its prompts answered in the notebook; returns when the user quits or continues."""
        self._debugging = True
        try:
            self.run(lambda cell: Debug(cell, failed_cell), [rank], prefix_output=False)
        finally:
            self._debugging = False

    def check_alive(self, note_exits: bool = True) -> None:
        """Raise the death of a rank that died since the last command (replaced first, where
        the ranks can be)."""
        if note_exits:
            self.ranks.note_exits()
        if self.ranks.dead_ranks():
            self._died()

    # -- waiting ------------------------------------------------------------------------

    def _wait(
        self, group: PoolRanks, targets: list[int], view: LaunchView | None, until: float | None
    ) -> bool:
        with locating(self._where_one):
            return self._wait_for_replies(group, targets, view, until)

    def _wait_for_replies(
        self, group: PoolRanks, targets: list[int], view: LaunchView | None, until: float | None
    ) -> bool:
        """Wait for every target's reply; False when ``until`` passed first.

        Once a target failed or died and the failures had their window to arrive, the targets
        still running are dealt with: kept ranks are freed as :mod:`~..pool_ranks.late` says
        (not interrupted again while the user's interrupt is on its way to each: ``until`` is
        then set); ranks stopped after the command are left to the outcome, which locates them.
        """
        while True:
            dead = group.dead_ranks()
            if dead and group.keeps and (not group.replaces_dead_ranks or self._replacing):
                self._died()
            now, late = time.monotonic(), self._late
            if group.restarting():  # the failures so far are an earlier attempt's
                late.window_ends = None
                self._returned_first = None
                failed = []
            else:
                if all(rank in group.done or rank in dead for rank in targets):
                    break  # a dead rank is replaced once the others are done
                failed = [r for r in targets if r in group.done and group.done[r].failure]
                failed += [r for r in targets if r in dead]
            if failed and self._returned_first is None:
                self._returned_first = returned_before(group.done, failed)
            if failed and late.window_ends is None:
                late.window_ends = now + group.collect_window(targets, dead)
            if late.window_ends is not None and late.deadline is None and now >= late.window_ends:
                if not group.keeps:
                    break  # the outcome locates the ranks still running; the stop ends them
                running = [r for r in targets if r not in group.done and r not in dead]
                late = self._late = free_late(
                    group,
                    running,
                    self._where,
                    self._detached,
                    functools.partial(self._release, group, failed),
                    INTERRUPT_GRACE_S,
                    interrupt=until is None,
                )
            recheck_late(late, group, self._where, self._detached, now)
            if stuck := late.stuck(group.done, now):
                self._stop_stuck(stuck, INTERRUPT_GRACE_S, "after another rank failed")
            remaining = None if until is None else until - now
            if remaining is not None and remaining <= 0:
                return False
            if (wake := late.wake(group.done, now)) is not None:
                remaining = wake if remaining is None else min(remaining, wake)
            group.watch(view, remaining)
        return True

    def _where(
        self, ranks: list[int], collectives: bool = True, within_s: float | None = None
    ) -> Mapping[int, RankStack]:
        return self.ranks.stacks(ranks, collectives, within_s) if ranks else {}

    def _where_one(self, rank: int) -> Location | None:
        stack = self._where([rank]).get(rank) if 0 <= rank < self.world_size else None
        return Location(stack.summary(), stack.text()) if stack is not None else None

    # -- interrupts ---------------------------------------------------------------------

    def _interrupted(
        self,
        group: PoolRanks,
        targets: list[int],
        view: LaunchView | None,
        interrupt: KeyboardInterrupt,
    ) -> None:
        """The kernel was interrupted while ``targets`` ran the command: kept ranks are
        interrupted and given their grace to stop; ranks that are stopped after the command
        are located first, for the interrupt to say where each was."""
        if group.keeps:
            self._unsettled = True
            self._interrupt(group, targets, view)
            return
        dead = group.dead_ranks()
        running = [r for r in targets if r not in group.done and r not in dead]
        within_s = group.interrupt_where_s
        stacks = self._where(running, within_s=within_s)
        silent = [rank for rank in running if rank not in stacks] if group.asked_where else []
        if (stacks or silent) and hasattr(interrupt, "add_note"):  # where, before they stop
            lines = where_lines(stacks, "was")
            if silent:
                it = "it was" if len(silent) == 1 else "they were"
                lines.append(f"  {rank_list(silent)} did not say where {it} within {within_s:g} s")
            interrupt.add_note("Interrupted while:\n" + "\n".join(lines))
            if note := stacks_note(stacks):
                interrupt.add_note(note)

    def _interrupt(self, group: PoolRanks, targets: list[int], view: LaunchView | None) -> None:
        send_interrupts(group, targets)
        deadline = time.monotonic() + INTERRUPT_GRACE_S
        while True:
            try:
                finished = self._wait(group, targets, view, deadline)
                break
            except KeyboardInterrupt:  # a second interrupt: the grace period still applies
                if self._given_up:  # unless it is a dead rank's error (the ranks stopped)
                    raise
                continue
        if not finished:
            stuck = [rank for rank in targets if rank not in group.done]
            self._stop_stuck(stuck, INTERRUPT_GRACE_S, "from the notebook")

    def _stop_stuck(self, stuck: list[int], grace: float, after: str) -> None:
        """Give up the ranks, and raise that ``stuck`` ignored an interrupt (sent ``after``)."""
        stacks = self._where(stuck)
        self._stop(f"rank(s) {stuck} did not stop after an interrupt")
        interrupt = stuck_interrupt(stuck, stacks, grace, after)
        try:
            raise interrupt
        finally:  # the traceback keeps this frame: it must not hold the interrupt
            del interrupt

    def _stop(self, why: str) -> None:
        self._given_up = True
        self._give_up(why)

    # -- after a failure ----------------------------------------------------------------

    def _release(self, group: PoolRanks, ranks: list[int]) -> None:
        """Have ``ranks`` (done with the current command) abort their process group."""
        self._unsettled = True  # the next command first makes a new group
        data = encode_command(Release(group.cell))
        for rank in ranks:
            with contextlib.suppress(OSError):  # a worker that died is noticed by the loop
                group.send(rank, data)

    def _settle(self) -> None:
        """Have the workers rebuild their process group if a collective was left unmatched or
        a rank released its group."""
        self._unsettled = False
        try:
            done = self.run(
                lambda cell: Settle(cell, self._timeout_s), list(range(self.world_size))
            )
        except Exception as error:
            if hasattr(error, "add_note"):
                error.add_note("(while remaking the process group after the previous failure)")
            raise
        issued = load_value(done[0])
        if issued is not None:
            print(REBUILT_NOTE, file=sys.stderr)

    def _died(self) -> None:
        group = self.ranks
        error = group.died(self.world_size, self._timeout_s)
        if group.replaces_dead_ranks and not self._replacing:  # between two commands
            self._replace(group, group.dead_ranks(), error, ran=False)
            try:
                raise error
            finally:  # the traceback keeps this frame: it must not hold the error
                del error
        self._stop(f"{type(error).__name__}: {str(error).splitlines()[0]}")
        if isinstance(error, (WorkerDiedError, LaunchError)) and hasattr(error, "add_note"):
            error.add_note(STOPPED_NOTE)
        try:
            raise error
        finally:  # the traceback keeps this frame: it must not hold the error
            del error

    def _outcome(
        self, group: PoolRanks, targets: list[int], view: LaunchView | None = None
    ) -> dict[int, CellDone] | BaseException:
        late = self._late
        where: dict[int, RankStack] = {}
        frozen: list[int] = []
        lost: dict[int, str] = {}
        if not group.keeps:  # the ranks that neither replied nor failed, located before
            failures = group.command_failures(targets, [], view)  # they are stopped
            running = [r for r in targets if r not in group.done and r not in failures.ranks]
            frozen = group.frozen(running)  # stopped processes: they cannot say where they are
            if running and failures.timeout_ranks:
                where = dict(self._where(running))
            group.hear_out()  # their last reports join the failures
            lost = group.out_of_reach(running)
        done = {rank: group.done[rank] for rank in targets if rank in group.done}
        dead = group.dead_ranks()
        stopped = [r for r in targets if r in done and late.stopped_by_failure(done[r])]
        log = group.command_failures(targets, stopped, view)
        finished = [r for r, d in done.items() if d.failure is None]
        first = self._returned_first
        if first is None and log:  # every reply came in one look: their stamps tell
            first = returned_before(done, [r for r, d in done.items() if d.failure])
        returned_later = [] if first is None else [r for r in finished if r not in first]
        if not log:
            problem = group.unexplained_end()
            if problem is None and len(finished) == len(targets):
                return done
            return problem or group.died(self.world_size, self._timeout_s)  # without a word
        self._unsettled = True
        discard_values(done.values())  # nobody will load them
        if group.keeps:  # the ranks freed after the failure, where they were then
            unfinished = stopped
            where = {r: late.stacks[r] for r in stopped if r in late.stacks}
        else:
            unfinished = [r for r in targets if r not in finished]
        error = failure_outcome(
            log,
            self.world_size,
            self._timeout_s,
            finished,
            unfinished,
            finished_as=group.finished_as,
            returned_later=returned_later,
            where=where if log.timeout_ranks else None,
            kept=group.keeps,
            prompts={r: p.status() for r, p in prompts_since(self._prompts_from).items()},
            frozen=frozen,
            out_of_reach=lost,
            elsewhere=group.elsewhere(),
        )
        group.add_history(error, log)
        if not group.keeps:
            group.keep_for_debugging(error, raising_ranks(log))
        elif dead:
            self._replace(group, dead, error, ran=True)
        elif not self._debugging:  # %debug opens where the ranks raised
            opener = functools.partial(self.debug, failed_cell=group.cell)
            offer_post_mortem(error, raising_ranks(log), opener, self)
        return error

    def _replace(self, group: PoolRanks, dead: list[int], error: BaseException, ran: bool) -> None:
        """Start a new process in place of each of the ``dead`` ranks and make the process
        group anew with the others; ``error`` (the ranks' death, ``ran``: during the command,
        else before it) is told what was lost. A rank that dies meanwhile gives up the ranks."""
        started = time.monotonic()
        self._replacing = True
        try:
            pids = group.replace(dead, self._cell + 1)
            self._unsettled = False
            survivors = [rank for rank in range(self.world_size) if rank not in dead]
            self.run(lambda cell: Settle(cell, self._timeout_s), survivors)
        finally:
            self._replacing = False
        took = time.monotonic() - started
        if hasattr(error, "add_note"):
            error.add_note(replaced_note(dead, pids, took, ran))


def returned_before(done: dict[int, CellDone], failed: list[int]) -> set[int]:
    """The ranks of ``done`` that returned before the first failure of the ``failed`` ranks:
    those that had returned when it was seen, but those whose worker stamped its return later
    than that failure (the replies of ranks on different hosts come on different channels,
    and one read first may have been sent last: a rank that returned after another's timeout
    came late, it was not absent)."""
    stamps = [done[rank].when for rank in failed if rank in done]
    first = min((stamp for stamp in stamps if stamp > 0), default=0.0)
    return {
        rank
        for rank, reply in done.items()
        if reply.failure is None and not (first and reply.when > first)
    }


def checked_targets(ranks: Sequence[int] | None, world_size: int) -> list[int]:
    """``ranks`` sorted, every rank when ``None``; a ``ValueError`` names those outside the
    ``world_size`` ranks."""
    chosen = sorted(set(range(world_size) if ranks is None else ranks))
    bad = [r for r in chosen if not 0 <= r < world_size]
    if bad or not chosen:
        raise ValueError(
            f"ranks {bad or list(ranks or [])} are not in this pool of {world_size} "
            f"(ranks 0 to {world_size - 1})"
        )
    return chosen
