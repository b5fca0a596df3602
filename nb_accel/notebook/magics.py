"""``%%distributed`` and ``%distributed``: develop distributed code cell by cell.

``%load_ext nb_accel`` registers the magics. A ``%%distributed`` cell runs on every rank of a
persistent :class:`~nb_accel.launch.pool.WorkerPool` (started on first use) in a namespace each
worker keeps across cells, preloaded with ``accelerator``, ``rank`` and ``world_size``::

    %%distributed -n 2
    model = torch.nn.Linear(4, 1)
    model = accelerator.prepare(model)

    %%distributed
    next(model.parameters()).sum()     # rank 0's value is displayed

The line magic manages the pool and moves values: ``%distributed start -n 2``, ``stop``,
``restart``, ``status``, ``where`` (every rank's stack, each thread's), ``push a b`` (kernel
variables to every worker), ``pull name`` (a per-rank list).

A cell whose ``-n`` differs from the running pool's restarts it with that many processes,
saying so; the other flags that say what the workers are are refused when they differ, naming
the ``%distributed restart`` that applies them.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import re
import sys
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

import cloudpickle
from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from .._messages import CellDone, Report
from ..config import load_config
from ..launch.debugging.kept_rank import RankEndedError
from ..launch.debugging.post_mortems import last_post_mortem
from ..launch.failures.user_errors import for_the_user, meant_for_the_user
from ..launch.pool import WorkerPool
from ..launch.pool_ranks.values import load_value
from ..launch.resolve import resolve_spec
from ..launch.spec import LaunchSpec
from ..launch.views.state_dict_note import show_wrapped_state_dicts
from ..launch.views.view import LaunchView
from ..launch.warm.kept import keep_pool, kept_pool, stop_workers
from ..runtime.device_types import choose_device_type
from ..runtime.device_types.cpu import CpuDevices
from . import compat_shell
from .debug_magic import install_debug_magic
from .launch_view import notebook_view
from .magic_flags import flag_text, parse_flags, pool_flags, pool_options, ranks_option
from .tracebacks import check_syntax, show_cell_syntax_errors

__all__ = [
    "DistributedMagics",
    "load_ipython_extension",
    "one_process_note",
    "resized_note",
    "stop_pool",
    "unload_ipython_extension",
]


class _CellView:
    """A launch view that appears in the cell only once a rank reports progress or metrics."""

    def __init__(
        self,
        title: str,
        world_size: int,
        all_ranks_metrics: bool,
        hosts: Sequence[str] | None = None,
    ) -> None:
        self._args = (title, world_size, all_ranks_metrics)
        self._hosts = hosts
        self._view: LaunchView | None = None
        self._started: list[tuple[int, int]] = []

    def started(self, rank: int, pid: int) -> None:
        """Remembered for the view, if one is made."""
        self._started.append((rank, pid))

    def report(self, event: Report) -> None:
        """Make (and display) the view on the first report."""
        if self._view is None:
            self._view = notebook_view(*self._args, hosts=self._hosts)
            if self._view is None:
                return
            for rank in range(self._args[1]):
                self._view.started(rank, 0)
        self._view.report(event)

    def failed(self, rank: int, summary: str) -> None:
        """Passed on when a view is shown."""
        if self._view is not None:
            self._view.failed(rank, summary)

    def returned(self, rank: int) -> None:
        """Passed on when a view is shown."""
        if self._view is not None:
            self._view.returned(rank)

    def stopped(self, rank: int, reason: str) -> None:
        """Passed on when a view is shown."""
        if self._view is not None:
            self._view.stopped(rank, reason)

    def tick(self) -> None:
        """Passed on when a view is shown."""
        if self._view is not None:
            self._view.tick()

    def finished(self, ok: bool) -> None:
        """Passed on when a view is shown."""
        if self._view is not None:
            self._view.finished(ok)

    def restarted(self, summary: str) -> None:
        """Passed on when a view is shown."""
        if self._view is not None:
            self._view.restarted(summary)


#: The message of a NameError for an undefined name.
_UNDEFINED = re.compile(r"name '(\w+)' is not defined")

_Magic = Callable[..., Any]


def _errors_for_the_user(magic: _Magic) -> _Magic:
    """``magic`` raising the user's errors (bad options, a worker's exception, an interrupt)
    with their message and a worker's traceback only, none of the magic's or the pool's
    frames; a defect of ours keeps its whole traceback."""

    @functools.wraps(magic)
    def shown(self: DistributedMagics, line: str, cell: str | None = None) -> Any:
        __tracebackhide__ = True  # IPython and pytest leave this frame out
        try:
            return magic(self, line, cell)
        except BaseException as error:
            if isinstance(error, UsageError) or not meant_for_the_user(error):
                raise  # IPython shows a UsageError as its message already
            failure = for_the_user(self._explained(error), kernel_frames=False)
            try:
                raise failure from failure.__cause__
            finally:  # the traceback keeps this frame: it must not hold the error
                del failure

    return shown


def _silenced(cell: str) -> bool:
    """True when the cell's last line ends with ``;`` (IPython then shows no result)."""
    lines = [line.split("#", 1)[0].rstrip() for line in cell.strip().splitlines()]
    lines = [line for line in lines if line]
    return bool(lines) and lines[-1].endswith(";")


@magic_arguments()
@argument(
    "command", choices=["start", "stop", "restart", "status", "where", "push", "pull", "debug"]
)
@argument("names", nargs="*", help="variables to push, the one to pull, or the rank to debug")
@argument("--ranks", help="ranks to push to or pull from, e.g. 0,1 (default: all)")
@pool_flags
def _line_usage(line: str) -> None:
    """%distributed start|stop|restart|status|where|push NAMES|pull NAME|debug RANK: manage
    the pool."""


def _running_cell_number(shell: Any) -> int:
    """The number the shell gives the cell running now (as its tracebacks say: ``Cell
    In[5]``), read from the frame that runs the cell's code."""
    frame = sys._getframe(1)
    while frame is not None:
        label = compat_shell.cell_label(shell, frame.f_code.co_filename)
        found = re.fullmatch(r"In\[(\d+)\]", label[1]) if label else None
        if found:
            return int(found.group(1))
        frame = frame.f_back  # type: ignore[assignment]
    return int(shell.execution_count)


def _cell_file(shell: Any, cell: str) -> str:
    """The file name a ``%%distributed`` cell's code runs under on the workers: the cell cached
    by the shell under the running cell's number, so that tracebacks and stacks name it as
    the shell names the cell (``Cell In[5], line 2``)."""
    if shell is None:
        return ""
    return compat_shell.cache_cell(shell, cell, _running_cell_number(shell))


def one_process_note(spec: LaunchSpec) -> str:
    """How the line that starts a pool of ``spec`` ends when the pool runs one process on the
    CPU only because nothing asked for more (no ``-n``, no saved ``num_processes``): why, and
    how to have more; ``""`` otherwise."""
    plan = spec.plan
    if (
        spec.hosts is not None
        or plan.device_type != CpuDevices.name
        or plan.num_processes != 1
        or spec.request.num_processes is not None
        or load_config().num_processes is not None
    ):
        return ""
    gpus = choose_device_type(False, own_launchers=False).name != CpuDevices.name
    why = "it runs on the CPU" if gpus else "this machine has no GPU"
    return (
        f": 1 process because {why} and no -n was given; %%distributed -n 4 starts 4, or save "
        "num_processes (the config form's Processes) to change the default"
    )


def resized_note(old: int, new: int, flag: str) -> str:
    """The line a cell whose ``flag`` (``-n 4``) asks for another number of processes than
    the running pool's prints as it restarts the pool: ``old`` ranks, now ``new``."""
    had = f"{old} process{'es' if old != 1 else ''}"
    return (
        f"The pool had {had}; restarting it with {new} for {flag} (the variables its ranks "
        "held are lost)"
    )


def stop_pool() -> None:
    """Stop the kernel's pool, if any: the warm workers, shared with
    ``notebook_launcher(..., reuse_workers=True)`` (see :func:`~nb_accel.stop_workers`)."""
    stop_workers()


def _load(rank: int, done: CellDone) -> Any:
    try:
        return load_value(done)
    except Exception as error:  # noqa: BLE001 - explained to the user
        raise UsageError(
            f"rank {rank}'s value could not be loaded in the kernel ({type(error).__name__}: "
            f"{error}); print it in the cell, or return plain data (numbers, tensors, lists)"
        ) from None


@magics_class
class DistributedMagics(Magics):  # type: ignore[misc]
    """The ``distributed`` line and cell magic, with one worker pool per kernel."""

    @property
    def pool(self) -> WorkerPool | None:
        """The kernel's pool: its warm workers (``None`` before the first start)."""
        return kept_pool()

    def _namespace(self) -> dict[str, Any]:
        assert self.shell is not None, "the magics run inside an IPython shell"
        namespace: dict[str, Any] = self.shell.user_ns
        return namespace

    def _stop(self) -> None:
        stop_pool()

    def _start(self, pool: WorkerPool) -> WorkerPool:
        pool.start()
        keep_pool(pool)
        print(f"Started {pool.describe()} for %%distributed{one_process_note(pool.spec)}")
        return pool

    def _existing_pool(self) -> WorkerPool:
        pool = self.pool
        if pool is None:
            raise UsageError("no pool is running: %%distributed -n N or %distributed start -n N")
        if not pool.running:
            raise UsageError(
                "the pool has stopped (a rank died or it was stopped): %distributed restart"
            )
        return pool

    def _running_pool(self, args: argparse.Namespace) -> WorkerPool:
        """The kernel's pool, started with the flags' settings on first use. Another ``-n``
        than the running pool's restarts it with that many processes, saying so; any other
        flag the running pool differs in is refused, saying how to restart with it."""
        pool = self.pool
        given = pool_options(args)
        if pool is None:
            return self._start(WorkerPool(**given))
        if not pool.running:
            raise UsageError("the pool has stopped (a rank died): %distributed restart")
        if not given:  # a cell without flags runs on the pool as it is
            return pool
        wanted = resolve_spec(pool.spec.with_options(**given), pool=True)
        shape, parser = pool.spec.shape, self.distributed.parser
        if wanted.shape == shape:
            return pool
        flags = " ".join(flag_text(parser, name, value) for name, value in given.items())
        if dataclasses.replace(wanted.shape, ranks_per_node=shape.ranks_per_node) != shape:
            raise UsageError(
                f"the pool runs with {', '.join(shape.differences(wanted.shape))}; "
                f"%distributed restart {flags} starts one with the new setting"
            )
        print(resized_note(pool.world_size, wanted.world_size, flags), file=sys.stderr)
        self._stop()  # the old workers are gone before the new ones start
        return self._start(WorkerPool(spec=wanted))

    @magic_arguments()
    @argument("--ranks", help="run on these ranks only, e.g. 0 or 0,1 (default: all)")
    @argument("--all-ranks", action="store_true", help="show every rank's output, prefixed")
    @argument("-o", "--output", help="store every rank's last-expression value in this variable")
    @pool_flags
    @line_cell_magic
    @_errors_for_the_user
    def distributed(self, line: str, cell: str | None = None) -> Any:
        """Run the cell on every rank of the persistent pool, or manage the pool (line)."""
        if cell is None:
            return self._line(line)
        args = parse_flags(self.distributed, line)
        source = "\n" + cell  # below the magic's line: line numbers as the notebook shows them
        name = _cell_file(self.shell, source)
        check_syntax(source, name or "<%%distributed cell>")  # before any rank runs it
        pool = self._running_pool(args)
        ranks = ranks_option(args.ranks)
        shown = min(ranks) if ranks else 0  # the rank whose value is the cell's result
        title = "%%distributed on " + pool.describe()
        view = _CellView(title, pool.world_size, bool(args.all_ranks), pool.rank_hosts)
        ok = False
        try:
            done = pool.execute(
                source,
                ranks,
                want_value=bool(args.output) or not _silenced(cell),
                name=name,
                value_ranks=None if args.output else [shown],
                all_output=bool(args.all_ranks),
                view=view,
            )
            ok = True
        finally:
            view.finished(ok)
        unpicklable = [rank for rank, d in done.items() if d.value is None and d.value_repr]
        if unpicklable:
            print(
                f"(rank(s) {sorted(unpicklable)}: the value could not be sent to the kernel; "
                "its repr is shown instead)"
            )
        values = {rank: _load(rank, d) for rank, d in sorted(done.items())}
        show_wrapped_state_dicts(values)
        if args.output:
            self._namespace()[args.output] = list(values.values())
            return None
        if _silenced(cell):
            return None
        return values[min(values)]  # displayed by IPython as the cell's result (Out, _)

    def _explained(self, error: BaseException) -> BaseException:
        """``error``, with a hint when a cell used a name that only the kernel defines."""
        found = _UNDEFINED.search(str(error)) if isinstance(error, NameError) else None
        if found and found.group(1) in self._namespace() and hasattr(error, "add_note"):
            name = found.group(1)
            error.add_note(
                f"`{name}` is defined in the kernel, but each worker has a namespace of its own: "
                f"`%distributed push {name}` sends it to the workers (or define it in a "
                "%%distributed cell)."
            )
        return error

    def _line(self, line: str) -> Any:
        args = parse_flags(_line_usage, line)
        if args.command == "start":
            if self.pool is not None and self.pool.running:
                raise UsageError("the pool is running: %distributed restart to start afresh")
            self._stop()
            self._start(WorkerPool(**pool_options(args)))
        elif args.command == "stop":
            self._stop()
        elif args.command == "restart":
            previous = self.pool.spec if self.pool is not None else None
            self._stop()
            given = pool_options(args)
            if previous is None:
                self._start(WorkerPool(**given))
            else:  # the same workers, whatever is saved since, unless given anew
                spec = resolve_spec(previous.with_options(**given), pool=True)
                self._start(WorkerPool(spec=spec))
        elif args.command == "status":
            return self._status()
        elif args.command == "where":
            return self._where(args)
        elif args.command == "push":
            return self._push(args)
        elif args.command == "debug":
            self._debug(args)
        else:
            return self._pull(args)
        return None

    def _status(self) -> None:
        if self.pool is None:
            print("no pool: %%distributed -n N (or %distributed start -n N) starts one")
            return
        if not self.pool.running:
            print(
                f"the pool of {self.pool.world_size} ranks has stopped (a rank died, it was "
                "interrupted, or stopped): %distributed restart starts it again"
            )
            return
        ranks = self.pool.status()
        width = max((len(rank.host) for rank in ranks), default=0)
        host = f"  {'host':<{width}}" if width else ""
        print(f"{'rank':>4}{host}  {'pid':>7}  {'alive':<5}  {'device':<7}  {'memory':>9}")
        for rank in ranks:
            memory = f"{rank.memory_mb:.0f} MB" if rank.memory_mb is not None else "-"
            host = f"  {rank.host:<{width}}" if width else ""
            print(
                f"{rank.rank:>4}{host}  {rank.pid:>7}  {'yes' if rank.alive else 'no':<5}  "
                f"{rank.device:<7}  {memory:>9}"
            )

    def _where(self, args: Any) -> None:
        pool = self._existing_pool()
        stacks = pool.where(ranks_option(args.ranks))
        for rank in ranks_option(args.ranks) or range(pool.world_size):
            stack = stacks.get(rank)
            if stack is None:
                print(f"rank {rank}: did not answer (dead, or its signals are blocked)")
                continue
            summary = stack.summary(idle="idle (waiting for a cell)")
            threads = stack.text(idle_main=False)
            print(
                f"rank {rank}: {summary}"
                + ("\n" + textwrap.indent(threads, "  ") if threads else "")
            )

    def _debug(self, args: Any) -> None:
        found = last_post_mortem()
        if found is None:
            raise UsageError(
                "no failure to inspect: %distributed debug RANK follows a launch or "
                "%%distributed cell in which ranks raised"
            )
        if len(args.names) > 1 or (args.names and not args.names[0].isdigit()):
            raise UsageError(
                f"%distributed debug RANK: one rank number, one of "
                f"{', '.join(map(str, found.ranks))}"
            )
        wanted = int(args.names[0]) if args.names else found.ranks[0]
        if wanted not in found.ranks:
            raise UsageError(
                f"rank {wanted} did not raise in the last failure; ranks "
                f"{', '.join(map(str, found.ranks))} did: %distributed debug RANK with one of them"
            )
        try:
            found.inspect_rank(wanted)
        except RankEndedError as ended:
            raise UsageError(str(ended)) from None

    def _push(self, args: Any) -> None:
        if not args.names:
            raise UsageError("%distributed push NAME [NAME ...]: which kernel variables?")
        missing = [name for name in args.names if name not in self._namespace()]
        if missing:
            raise UsageError(f"not defined in the kernel: {', '.join(missing)}")
        pool = self._existing_pool()
        values = {name: self._namespace()[name] for name in args.names}
        for name, value in values.items():
            try:
                cloudpickle.dumps(value)
            except Exception as error:  # noqa: BLE001 - explained to the user
                raise UsageError(
                    f"cannot send {name} to the workers: {type(error).__name__}: {error} "
                    "(locks, open files and sockets cannot travel; make one on each rank)"
                ) from None
        pool.push(values, ranks_option(args.ranks))

    def _pull(self, args: Any) -> list[Any]:
        if len(args.names) != 1:
            raise UsageError("%distributed pull NAME: one variable, returned as a per-rank list")
        pool = self._existing_pool()
        ranks = ranks_option(args.ranks)
        values = pool.pull(args.names[0], ranks)
        pulled_ranks = sorted(ranks or range(pool.world_size))
        show_wrapped_state_dicts(dict(zip(pulled_ranks, values, strict=True)))
        return values


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext nb_accel``: register the ``%distributed`` / ``%%distributed`` magics (and
    ``%debug`` for a rank's failure)."""
    ipython.register_magics(DistributedMagics)
    install_debug_magic(ipython)
    show_cell_syntax_errors(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext nb_accel`` (and ``%reload_ext``): stop the pool."""
    del ipython
    stop_pool()
