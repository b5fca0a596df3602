"""A persistent worker pool: N ranks that keep their process group and namespace across cells.

The pool is an ordinary launch (same start methods, environment and process group as
``notebook_launcher``) whose function is the worker's command loop
(:func:`~nb_accel.worker.process.pool_worker.serve`). The kernel sends commands to each rank
through :class:`~nb_accel.launch.pool_ranks.interface.PoolRanks` (down each worker's event
connection on this machine, or through each host's node process for a pool spread over hosts)
and watches the same events as a launch, plus one :class:`~nb_accel._messages.CellDone` per
rank and command.

Kernel → Interrupt while a command runs sends SIGINT to the workers, which raises
``KeyboardInterrupt`` in their code; a rank that does not stop within :data:`INTERRUPT_GRACE_S`
(stuck in a collective, say) is named and the pool is stopped, to be restarted. After a failed
or interrupted command, the next one is preceded by a
:class:`~nb_accel._messages.Settle`: a collective left unmatched would pair with the
next cell's, so the workers then rebuild their process group.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._messages import (
    CellDone,
    Command,
    Debug,
    Execute,
    Pull,
    Push,
    Release,
    Settle,
    Stop,
    encode_command,
)
from ..errors import LaunchError, WorkerDiedError
from ..worker.transfer.pickling import pickle_sharing
from .debugging.kept_rank import release_kept_rank
from .debugging.post_mortems import forget_post_mortem, offer_post_mortem, raising_ranks
from .failures.failure_log import FailureLog
from .failures.whereabouts import RankStack
from .hosts.pool_ranks import start_host_ranks
from .launchers.interface import Launcher
from .launchers.left_open_runs import end_runs_left_open
from .launchers.outcome import failure_outcome
from .payload import own_module_by_value
from .placement.hosts import HostPlan
from .plan import LaunchPlan, show_notes
from .pool_ranks.calls import call_command
from .pool_ranks.interface import PoolRanks, RankStatus
from .pool_ranks.late import (
    LateRanks,
    collect_window,
    free_late,
    send_interrupts,
    stuck_interrupt,
)
from .pool_ranks.local import start_local_ranks
from .pool_ranks.notes import REBUILT_NOTE, STOPPED_NOTE, replaced_note
from .pool_ranks.values import discard_values, load_value
from .resolve import resolve_pool_spec
from .spec import LaunchSpec
from .views.output import OutputPrinter
from .views.view import LaunchView, NullView

__all__ = ["INTERRUPT_GRACE_S", "RankStatus", "WorkerPool"]

#: How long interrupted ranks (by the user, or as another failed) may take to stop (seconds).
INTERRUPT_GRACE_S = 10.0


class WorkerPool(Launcher):
    """Persistent workers for ``%%distributed`` cells: a launcher whose workers run each
    command sent to them (:meth:`run`) until it is stopped.

    Args:
        num_processes: number of ranks (on each host, with ``hosts``); ``None``: the saved
            configuration's, else as ``notebook_launcher``.
        spec: the workers, resolved already (the other arguments are then not given).
        options: any other option of ``notebook_launcher`` (``mixed_precision``,
            ``start_method``, ``timeout``, ``cpu``, ``fsdp``, ``sharding``, ``hosts``,
            ``ssh_config``, ``remote_python``, ...), meaning the same; ``None``: the saved
            configuration's value. The workers run on this machine, or on ``hosts``.
    """

    def __init__(
        self, num_processes: int | None = None, *, spec: LaunchSpec | None = None, **options: Any
    ) -> None:
        if spec is None:
            spec = resolve_pool_spec(num_processes, options)
        #: What the workers are: ranks, devices, start method, hosts, as resolved.
        self.spec: LaunchSpec = spec
        self._group: PoolRanks | None = None
        self._cell = 0
        self._unsettled = False  # a command failed or was interrupted since the last Settle
        self._debugging = False  # the command running is a post-mortem
        self._environ_at_start: dict[str, str] = {}
        #: Why the workers stopped on their own (a rank died, ...); "" while they run.
        self.stopped_because = ""
        self._waiting_for: list[int] = []  # the ranks the current command was sent to
        self._replacing = False  # dead ranks are being replaced (a death now stops the pool)
        self._late = LateRanks()  # the current command's ranks stopped by another's failure
        #: The current command's view.
        self.view: LaunchView = NullView()

    @property
    def plan(self) -> LaunchPlan:
        """What each machine runs."""
        return self.spec.plan

    @property
    def hosts(self) -> HostPlan | None:
        """The hosts the pool is spread over (``None``: this machine only)."""
        return self.spec.hosts

    @property
    def world_size(self) -> int:
        """Number of ranks (on every host together)."""
        return self.spec.world_size

    def describe(self) -> str:
        """The pool in words: ``"2 processes on CPU (gloo; fork)"``, with its hosts."""
        return self.spec.describe_pool()

    @property
    def rank_hosts(self) -> list[str] | None:
        """Each rank's host, in rank order (``None``: every rank runs on this machine)."""
        return self.spec.rank_hosts

    @property
    def running(self) -> bool:
        """True while the workers are up (started, not stopped, none dead)."""
        return self._group is not None and not self._group.dead_ranks()

    def start(self, notes: bool = True) -> None:
        """Start the workers and wait until each has its process group and namespace; with
        ``notes``, the plan's notes are printed first (a launch that starts the pool has)."""
        if self._group is not None:
            raise RuntimeError("the pool is already started; stop or restart it")
        if notes:
            show_notes(self.plan)
        self._unsettled = False
        self._environ_at_start = dict(os.environ)  # what the workers inherited
        if self.hosts is not None:
            self._group = start_host_ranks(self.plan, self.hosts)
        else:
            self._group = start_local_ranks(self.plan)
        try:
            self.execute("pass")  # every rank is ready once this returns
        except KeyboardInterrupt:
            self.stop(graceful=False)
            raise KeyboardInterrupt("interrupted while the pool was starting") from None

    def stop(self, graceful: bool = True) -> None:
        """Stop every worker and forget the pool: asked to leave (given a few seconds with
        ``graceful``), then terminated."""
        group, self._group = self._group, None
        forget_post_mortem(self)  # the frames go with the workers
        if group is None:
            return
        data = encode_command(Stop())
        for rank in range(self.world_size):
            with contextlib.suppress(OSError):
                group.send(rank, data)
        group.stop(graceful=graceful and not group.dead_ranks())
        if self.hosts is None:  # across hosts, each host's node ends its workers' runs
            end_runs_left_open(group.events.open_runs.values())

    def restart(self) -> None:
        """Stop and start again (a fresh namespace on every rank)."""
        self.stop()
        self.start()

    def status(self) -> list[RankStatus]:
        """Rank, pid, liveness, device and resident memory of every worker."""
        return [] if self._group is None else self._group.status()

    def where(
        self, ranks: Sequence[int] | None = None, collectives: bool = True
    ) -> dict[int, RankStack]:
        """Every rank's stacks (all threads), taken without stopping it, with the last
        collective each entered (unless ``collectives`` is false); ranks that cannot say (dead,
        or not answering within a second) are left out."""
        if self._group is None:
            return {}
        return self._group.stacks(self._targets(ranks), collectives)

    def _targets(self, ranks: Sequence[int] | None) -> list[int]:
        chosen = sorted(set(range(self.world_size) if ranks is None else ranks))
        bad = [r for r in chosen if not 0 <= r < self.world_size]
        if bad or not chosen:
            raise ValueError(
                f"ranks {bad or list(ranks or [])} are not in this pool of {self.world_size} "
                f"(ranks 0 to {self.world_size - 1})"
            )
        return chosen

    def _group_or_fail(self, note_exits: bool = True) -> PoolRanks:
        if self._group is None:
            raise RuntimeError("the pool is not started: %distributed start -n N")
        if note_exits:
            self._group.note_exits()
        if self._group.dead_ranks():
            self._died(self._group)
        return self._group

    def run(
        self,
        make_command: Callable[[int], Command | Settle],
        ranks: Sequence[int] | None = None,
        *,
        all_output: bool = False,
        prefix_output: bool = True,
        view: LaunchView | None = None,
    ) -> dict[int, CellDone]:
        """Send ``make_command(cell)`` to ``ranks`` and wait until each has done it.

        Output of rank 0 (of every rank with ``all_output``) is written as it arrives. A
        failure on any rank is raised in the kernel as for a launch (original type, ranks
        named, identical failures grouped) and the workers stay up.
        """
        release_kept_rank()  # a launch's rank kept for %debug: this cell comes after
        if self._unsettled:
            self._settle()
        group = self._group_or_fail()
        targets = self._targets(ranks)
        self._cell += 1
        group.cell, group.done = self._cell, {}
        output = group.output
        output.printer.flush()  # anything printed between two commands
        printer = OutputPrinter(
            len(targets) if all_output else 1, prefix_output, view=view, place_of=group.place_of
        )
        output.printer, output.shown = printer, None if all_output else targets[0]
        data = encode_command(make_command(self._cell))
        for rank in targets:
            try:
                group.send(rank, data)
            except OSError:  # the worker has just died: say so (once the others are done)
                group.note_exits()
                if not group.replaces_dead_ranks or self._replacing:
                    self._died(group)
        self._waiting_for, self.view = targets, printer.view
        self._late = LateRanks()
        try:
            self._wait(group, targets, printer.view, None)
        except KeyboardInterrupt:
            self._unsettled = True
            self._interrupt(group, targets, printer.view)
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

    def wait(self) -> dict[int, CellDone] | BaseException:
        """Wait until every rank the current command went to has done it; returns their
        replies by rank, or the exception for the command's failures (a worker's death is
        raised, the pool stopped)."""
        group = self._group_or_fail(note_exits=False)
        self._wait(group, self._waiting_for, self.view, None)
        return self._outcome(group, self._waiting_for, self.view)

    def _wait(
        self, group: PoolRanks, targets: list[int], view: LaunchView | None, until: float | None
    ) -> bool:
        """Wait for every target's :class:`CellDone`; False when ``until`` passed first.

        Once a target failed or died and the failures had their window to arrive, the targets
        still running are freed as :mod:`~nb_accel.launch.pool_ranks.late` says (not interrupted
        again while the user's interrupt is on its way to each: ``until`` is then set).
        """
        while True:
            dead = group.dead_ranks()
            if dead and (not group.replaces_dead_ranks or self._replacing):
                self._died(group)
            if all(rank in group.done or rank in dead for rank in targets):
                break  # a dead rank is replaced once the others are done
            now, late = time.monotonic(), self._late
            failed = [r for r in targets if r in group.done and group.done[r].failure is not None]
            failed += [r for r in targets if r in dead]
            if failed and late.window_ends is None:
                late.window_ends = now + collect_window(group, targets, dead)
            if late.window_ends is not None and late.deadline is None and now >= late.window_ends:
                running = [r for r in targets if r not in group.done and r not in dead]
                late = self._late = free_late(
                    group,
                    running,
                    self.where,
                    self.plan.device.detached_collectives(self.plan.backend),
                    functools.partial(self._release, group, failed),
                    INTERRUPT_GRACE_S,
                    interrupt=until is None,
                )
            if stuck := late.stuck(group.done, now):
                self._stop_stuck(stuck, INTERRUPT_GRACE_S, "after another rank failed")
            remaining = None if until is None else until - now
            if remaining is not None and remaining <= 0:
                return False
            if (wake := late.wake(group.done, now)) is not None:
                remaining = wake if remaining is None else min(remaining, wake)
            group.watch(view, remaining)
        return True

    def _stop_stuck(self, stuck: list[int], grace: float, after: str) -> None:
        """Stop the pool, and raise that ``stuck`` ignored an interrupt (sent ``after`` ...)."""
        stacks = self.where(stuck)
        self.stopped_because = f"rank(s) {stuck} did not stop after an interrupt"
        self.stop(graceful=False)
        interrupt = stuck_interrupt(stuck, stacks, grace, after)
        try:
            raise interrupt
        finally:  # the traceback keeps this frame: it must not hold the interrupt
            del interrupt

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
            done = self.run(lambda cell: Settle(cell, self.plan.timeout_s))
        except Exception as error:
            if hasattr(error, "add_note"):
                error.add_note("(while checking the process group after the previous cell failed)")
            raise
        issued = load_value(done[0])
        if issued is not None:
            print(REBUILT_NOTE, file=sys.stderr)

    def _died(self, group: PoolRanks) -> None:
        error = group.died(self.world_size, self.plan.timeout_s)
        if group.replaces_dead_ranks and not self._replacing:  # between two commands
            self._replace(group, group.dead_ranks(), error, ran=False)
            try:
                raise error
            finally:  # the traceback keeps this frame: it must not hold the error
                del error
        self.stopped_because = f"{type(error).__name__}: {str(error).splitlines()[0]}"
        self.stop(graceful=False)
        if isinstance(error, (WorkerDiedError, LaunchError)) and hasattr(error, "add_note"):
            error.add_note(STOPPED_NOTE)
        try:
            raise error
        finally:  # the traceback keeps this frame: it must not hold the error
            del error

    def _interrupt(self, group: PoolRanks, targets: list[int], view: LaunchView | None) -> None:
        send_interrupts(group, targets)
        deadline = time.monotonic() + INTERRUPT_GRACE_S
        while True:
            try:
                finished = self._wait(group, targets, view, deadline)
                break
            except KeyboardInterrupt:  # a second interrupt: the grace period still applies
                if self._group is None:  # unless it is a dead rank's error (the pool stopped)
                    raise
                continue
        if not finished:
            stuck = [rank for rank in targets if rank not in group.done]
            self._stop_stuck(stuck, INTERRUPT_GRACE_S, "from the notebook")

    def _outcome(
        self, group: PoolRanks, targets: list[int], view: LaunchView | None = None
    ) -> dict[int, CellDone] | BaseException:
        done = {rank: group.done[rank] for rank in targets if rank in group.done}
        log = FailureLog(view)  # the root cause shown failed, its knock-on failures stopped
        dead = group.dead_ranks()
        for record in group.events.failures.records:  # how each dead rank died
            if record.rank in dead:
                log.add(record)
        late = self._late
        stopped = [r for r in targets if r in done and late.stopped_by_failure(done[r])]
        for reply in group.done.values():  # in the order they arrived
            if reply.failure is not None and reply.rank not in stopped:
                log.add_event(reply.failure)
        if log:
            self._unsettled = True
            discard_values(done.values())  # nobody will load them
            finished = [r for r, d in done.items() if d.failure is None]
            where = {r: late.stacks[r] for r in stopped if r in late.stacks}
            error = failure_outcome(
                log,
                self.world_size,
                self.plan.timeout_s,
                finished,
                stopped,
                finished_as="finished the cell",
                where=where if log.timeout_ranks else None,
            )
            if dead:
                self._replace(group, dead, error, ran=True)
            elif not self._debugging:  # %debug opens where the ranks raised
                cell = group.cell
                opener = functools.partial(self.debug, failed_cell=cell)
                offer_post_mortem(error, raising_ranks(log), opener, self)
            return error
        return done

    def _replace(self, group: PoolRanks, dead: list[int], error: BaseException, ran: bool) -> None:
        """Start a new process in place of each of the ``dead`` ranks and make the process
        group anew with the others; ``error`` (the ranks' death, ``ran``: during the command,
        else before it) is told what was lost. A rank that dies meanwhile stops the pool."""
        started = time.monotonic()
        self._replacing = True
        try:
            pids = group.replace(dead, self._cell + 1)
            self._unsettled = False
            survivors = [rank for rank in range(self.world_size) if rank not in dead]
            self.run(lambda cell: Settle(cell, self.plan.timeout_s), survivors)
        finally:
            self._replacing = False
        took = time.monotonic() - started
        if hasattr(error, "add_note"):
            error.add_note(replaced_note(dead, pids, took, ran))

    def debug(self, rank: int, failed_cell: int) -> None:
        """Open the debugger on rank ``rank``'s frames where command ``failed_cell`` raised,
        its prompts answered in the notebook; returns when the user quits or continues."""
        self._debugging = True
        try:
            self.run(lambda cell: Debug(cell, failed_cell), [rank], prefix_output=False)
        finally:
            self._debugging = False

    def execute(
        self,
        code: str,
        ranks: Sequence[int] | None = None,
        want_value: bool = False,
        name: str = "",
        value_ranks: Sequence[int] | None = None,
        **options: Any,
    ) -> dict[int, CellDone]:
        """Run ``code`` on ``ranks`` (default: every rank); ``name`` names it in tracebacks
        (``In[7]``); with ``want_value`` the ranks in ``value_ranks`` (default: all) send back
        the value of the last expression; see :meth:`run` for ``options``."""
        chosen = tuple(value_ranks or ())
        return self.run(
            lambda cell: Execute(cell, code, want_value, name, chosen), ranks, **options
        )

    def push(self, values: dict[str, Any], ranks: Sequence[int] | None = None) -> None:
        """Set ``values`` as variables on ``ranks`` (cloudpickled, so functions and classes
        defined in the notebook travel too; big tensors and arrays are written once into
        shared memory, which every rank maps copy-on-write)."""
        group = self._group_or_fail()
        data = group.seal(pickle_sharing(values))
        try:
            self.run(lambda cell: Push(cell, data), ranks)
        finally:  # every rank has mapped its segments (or will not)
            group.settle(data)

    def call(
        self,
        function: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> list[Any]:
        """Run ``function(*args, **kwargs)`` on every rank as a launch would, and return each
        rank's value in rank order (see :mod:`~nb_accel.worker.warm.call` for what
        each rank takes on from the kernel first); ``options`` as for :meth:`run`. The call
        travels cloudpickled, big tensors and arrays through shared memory, written once."""
        group = self._group_or_fail()
        with own_module_by_value(function, elsewhere=self.hosts is not None):
            data = group.seal(pickle_sharing((function, tuple(args), dict(kwargs or {}))))
        local = None if self.hosts is not None else self._environ_at_start
        command = functools.partial(
            call_command, data=data, environ_at_start=local, start_method=self.plan.start_method
        )
        try:
            done = self.run(command, **options)
        finally:  # every rank has mapped its segments (or will not)
            group.settle(data)
        return [load_value(d) for _, d in sorted(done.items())]

    def pull(self, name: str, ranks: Sequence[int] | None = None) -> list[Any]:
        """The value of variable ``name`` on each of ``ranks``, in rank order."""
        done = self.run(lambda cell: Pull(cell, name), ranks)
        return [load_value(d) for _, d in sorted(done.items())]
