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
next cell's, so the workers then rebuild their process group. A rank that died is replaced by
a new process (the driver does it), and the error that says so also names the variables the
other ranks hold that the new one lacks (:func:`~.pool_ranks.notes.lacking_note`).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from .._messages import CellDone, Command, Execute, Pull, Push, Settle, Stop, encode_command
from ..worker.transfer.pickling import pickle_sharing
from .debugging.kept_rank import release_kept_rank
from .debugging.post_mortems import forget_post_mortem
from .driver.driver import INTERRUPT_GRACE_S, RankDriver, checked_targets
from .failures.whereabouts import RankStack
from .hosts.pool_ranks import start_host_ranks
from .launchers.interface import Launcher
from .launchers.left_open_runs import end_runs_left_open
from .payload import own_module_by_value
from .placement.hosts import HostPlan
from .plan import LaunchPlan, show_notes
from .pool_ranks.calls import call_command
from .pool_ranks.interface import PoolRanks, RankStatus
from .pool_ranks.local import start_local_ranks
from .pool_ranks.notes import NAMES_CODE, lacking_names, lacking_note
from .pool_ranks.values import load_value
from .resolve import resolve_pool_spec
from .spec import LaunchSpec
from .views.view import LaunchView, NullView

__all__ = ["INTERRUPT_GRACE_S", "RankStatus", "WorkerPool"]


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
        self._driver: RankDriver | None = None
        self._environ_at_start: dict[str, str] = {}
        self._launching = False  # a launch's call runs: the namespaces are not its concern
        #: Why the workers stopped on their own (a rank died, ...); "" while they run.
        self.stopped_because = ""

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
        self._environ_at_start = dict(os.environ)  # what the workers inherited
        if self.hosts is not None:
            self._group = start_host_ranks(self.plan, self.hosts)
        else:
            self._group = start_local_ranks(self.plan)
        plan = self.plan
        self._driver = RankDriver(
            self._group,
            self.world_size,
            plan.timeout_s,
            plan.device.detached_collectives(plan.backend),
            self._give_up,
        )
        try:
            self.execute("pass")  # every rank is ready once this returns
        except KeyboardInterrupt:
            self.stop(graceful=False)
            raise KeyboardInterrupt("interrupted while the pool was starting") from None

    def _give_up(self, why: str) -> None:
        """Stop the pool, for ``why`` (a rank died, did not stop after an interrupt)."""
        self.stopped_because = why
        self.stop(graceful=False)

    def stop(self, graceful: bool = True) -> None:
        """Stop every worker and forget the pool: asked to leave (given a few seconds with
        ``graceful``), then terminated."""
        group, self._group = self._group, None
        driver, self._driver = self._driver, None
        forget_post_mortem(driver)  # the frames go with the workers
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
        return self._group.stacks(checked_targets(ranks, self.world_size), collectives)

    def _ranks(self) -> PoolRanks:
        """The started ranks, alive (a death since the last command is raised first)."""
        with self._naming_lost_variables():
            self._driver_or_fail().check_alive()
        assert self._group is not None, "started"
        return self._group

    @contextlib.contextmanager
    def _naming_lost_variables(self) -> Iterator[None]:
        """Add to the error raised inside, where ranks were replaced meanwhile, what
        :meth:`_name_lost_variables` says."""
        if self._group is not None:
            self._group.take_new_ranks()  # replaced outside this (a debugger's command): told
        try:
            yield
        except BaseException as error:
            self._name_lost_variables(error)
            raise

    def _name_lost_variables(self, error: BaseException) -> None:
        """Where ranks were replaced since the pool last asked (``error`` says they died): note
        on ``error`` which of their variables the other ranks hold that the new ranks lack,
        asked of every rank. Unsaid when the question fails (the ranks stopped meanwhile)."""
        group, driver = self._group, self._driver
        new = group.take_new_ranks() if group is not None else []
        if self._launching or not new or driver is None or not self.running:
            return
        if not hasattr(error, "add_note"):
            return
        ranks = list(range(self.world_size))
        try:
            done = driver.run(lambda cell: Execute(cell, NAMES_CODE, want_value=True), ranks)
            held = {rank: load_value(reply) for rank, reply in done.items()}
        except Exception:  # noqa: BLE001 - the error being raised says what matters
            if group is not None:
                group.take_new_ranks()  # replaced while asking: that error told it, unraised
            return
        error.add_note(lacking_note(new, lacking_names(held, new)))

    def _driver_or_fail(self) -> RankDriver:
        if self._driver is None:
            raise RuntimeError("the pool is not started: %distributed start -n N")
        return self._driver

    @property
    def view(self) -> LaunchView:  # type: ignore[override]  # the driver's, set per command
        """The current command's view."""
        return NullView() if self._driver is None else self._driver.view

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
        named, identical failures grouped) and the workers stay up (see
        :class:`~nb_accel.launch.driver.driver.RankDriver`).
        """
        release_kept_rank()  # a launch's rank kept for %debug: this cell comes after
        driver = self._driver_or_fail()
        with self._naming_lost_variables():
            driver.check_alive()
            return driver.run(
                make_command,
                checked_targets(ranks, self.world_size),
                all_output=all_output,
                prefix_output=prefix_output,
                view=view,
            )

    def wait(self) -> dict[int, CellDone] | BaseException:
        """Wait until every rank the current command went to has done it; returns their
        replies by rank, or the exception for the command's failures (a worker's death is
        raised, the pool stopped)."""
        driver = self._driver_or_fail()
        with self._naming_lost_variables():
            outcome = driver.wait()
        if isinstance(outcome, BaseException):
            self._name_lost_variables(outcome)
        return outcome

    def debug(self, rank: int, failed_cell: int) -> None:
        """Open the debugger on rank ``rank``'s frames where command ``failed_cell`` raised,
        its prompts answered in the notebook; returns when the user quits or continues."""
        self._driver_or_fail().debug(rank, failed_cell)

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
        group = self._ranks()
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
        travels cloudpickled, big tensors and arrays through shared memory, written once. A
        rank replaced meanwhile is not told what variables it lacks: a launch uses none (its
        residents are built again when first used)."""
        self._launching = True
        try:
            group = self._ranks()
            with own_module_by_value(function, elsewhere=self.hosts is not None):
                data = group.seal(pickle_sharing((function, tuple(args), dict(kwargs or {}))))
            local = None if self.hosts is not None else self._environ_at_start
            command = functools.partial(
                call_command,
                data=data,
                environ_at_start=local,
                start_method=self.plan.start_method,
            )
            try:
                done = self.run(command, **options)
            finally:  # every rank has mapped its segments (or will not)
                group.settle(data)
        finally:
            self._launching = False
        return [load_value(d) for _, d in sorted(done.items())]

    def pull(self, name: str, ranks: Sequence[int] | None = None) -> list[Any]:
        """The value of variable ``name`` on each of ``ranks``, in rank order."""
        done = self.run(lambda cell: Pull(cell, name), ranks)
        return [load_value(d) for _, d in sorted(done.items())]
