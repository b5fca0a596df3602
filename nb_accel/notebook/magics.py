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
``restart``, ``status``, ``push a b`` (kernel variables to every worker), ``pull name``
(a per-rank list).
"""

from __future__ import annotations

import atexit
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from .._messages import Report
from ..launch.pool import WorkerPool, load_value
from ..launch.view import LaunchView
from .launch_view import notebook_view

__all__ = ["DistributedMagics", "load_ipython_extension"]


class _CellView:
    """A launch view that appears in the cell only once a rank reports progress or metrics."""

    def __init__(self, title: str, world_size: int, all_ranks_metrics: bool) -> None:
        self._args = (title, world_size, all_ranks_metrics)
        self._view: LaunchView | None = None
        self._started: list[tuple[int, int]] = []

    def started(self, rank: int, pid: int) -> None:
        """Remembered for the view, if one is made."""
        self._started.append((rank, pid))

    def report(self, event: Report) -> None:
        """Make (and display) the view on the first report."""
        if self._view is None:
            self._view = notebook_view(*self._args)
            if self._view is None:
                return
            for rank in range(self._args[1]):
                self._view.started(rank, 0)
        self._view.report(event)

    def failed(self, rank: int, summary: str) -> None:
        """Passed on when a view is shown."""
        if self._view is not None:
            self._view.failed(rank, summary)

    def tick(self) -> None:
        """Passed on when a view is shown."""
        if self._view is not None:
            self._view.tick()

    def finished(self, ok: bool) -> None:
        """Passed on when a view is shown."""
        if self._view is not None:
            self._view.finished(ok)


def _ranks(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"--ranks takes rank numbers separated by commas, got {text!r}") from None


@magic_arguments()
@argument("command", choices=["start", "stop", "restart", "status", "push", "pull"])
@argument("names", nargs="*", help="variables to push, or the one to pull")
@argument("-n", "--num-processes", type=int, help="number of ranks (start, restart)")
@argument("--ranks", help="ranks to push to or pull from, e.g. 0,1 (default: all)")
@argument("--start-method", help="fork, spawn or forkserver")
@argument("--mixed-precision", help="no, bf16 or fp16")
@argument("--cpu", action="store_true", help="use the CPU even when GPUs are present")
def _line_usage(line: str) -> None:
    """%distributed start|stop|restart|status|push NAMES|pull NAME: manage the pool."""


@magics_class
class DistributedMagics(Magics):  # type: ignore[misc]
    """The ``distributed`` line and cell magic, with one worker pool per kernel."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.pool: WorkerPool | None = None
        atexit.register(self._stop)

    def _namespace(self) -> dict[str, Any]:
        assert self.shell is not None, "the magics run inside an IPython shell"
        namespace: dict[str, Any] = self.shell.user_ns
        return namespace

    def _stop(self) -> None:
        if self.pool is not None:
            self.pool.stop()
            self.pool = None

    def _start(self, args: Any) -> WorkerPool:
        pool = WorkerPool(
            args.num_processes,
            mixed_precision=args.mixed_precision,
            start_method=args.start_method,
            cpu=True if args.cpu else None,
        )
        pool.start()
        self.pool = pool
        print(pool.plan.describe().replace("Launching", "Started", 1) + " for %%distributed")
        return pool

    def _running_pool(self, args: Any) -> WorkerPool:
        pool = self.pool
        if pool is not None and not pool.running:
            raise UsageError("the pool has stopped (a rank died): %distributed restart")
        if pool is None:
            return self._start(args)
        wanted = args.num_processes
        if wanted is not None and wanted != pool.world_size:
            raise UsageError(
                f"the pool has {pool.world_size} ranks; %distributed restart -n {wanted} "
                "starts one with a different number"
            )
        return pool

    @magic_arguments()
    @argument("-n", "--num-processes", type=int, help="number of ranks (first use)")
    @argument("--ranks", help="run on these ranks only, e.g. 0 or 0,1 (default: all)")
    @argument("--all-ranks", action="store_true", help="show every rank's output, prefixed")
    @argument("-o", "--output", help="store every rank's last-expression value in this variable")
    @argument("--start-method", help="fork, spawn or forkserver (first use)")
    @argument("--mixed-precision", help="no, bf16 or fp16 (first use)")
    @argument("--cpu", action="store_true", help="use the CPU even when GPUs are present")
    @line_cell_magic
    def distributed(self, line: str, cell: str | None = None) -> Any:
        """Run the cell on every rank of the persistent pool, or manage the pool (line)."""
        if cell is None:
            return self._line(line)
        args = parse_argstring(self.distributed, line)
        pool = self._running_pool(args)
        ranks = _ranks(args.ranks)
        view = _CellView(pool.plan.describe(), pool.world_size, bool(args.all_ranks))
        ok = False
        try:
            done = pool.execute(
                cell, ranks, want_value=True, all_output=bool(args.all_ranks), view=view
            )
            ok = True
        finally:
            view.finished(ok)
        values = {rank: load_value(d) for rank, d in sorted(done.items())}
        if args.output:
            self._namespace()[args.output] = list(values.values())
        first = values[min(values)]
        if first is not None and not args.output:
            display(first)
        return None

    def _line(self, line: str) -> Any:
        args = parse_argstring(_line_usage, line)
        if args.command == "start":
            if self.pool is not None and self.pool.running:
                raise UsageError("the pool is running: %distributed restart to start afresh")
            self._stop()
            self._start(args)
        elif args.command == "stop":
            self._stop()
        elif args.command == "restart":
            size = args.num_processes or (self.pool.world_size if self.pool else None)
            self._stop()
            args.num_processes = size
            self._start(args)
        elif args.command == "status":
            return self._status()
        elif args.command == "push":
            return self._push(args)
        else:
            return self._pull(args)
        return None

    def _status(self) -> None:
        if self.pool is None:
            print("no pool: %%distributed -n N (or %distributed start -n N) starts one")
            return
        print(f"{'rank':>4}  {'pid':>7}  {'alive':<5}  {'device':<7}  {'memory':>9}")
        for rank in self.pool.status():
            memory = f"{rank.memory_mb:.0f} MB" if rank.memory_mb is not None else "-"
            print(
                f"{rank.rank:>4}  {rank.pid:>7}  {'yes' if rank.alive else 'no':<5}  "
                f"{rank.device:<7}  {memory:>9}"
            )

    def _push(self, args: Any) -> None:
        if not args.names:
            raise UsageError("%distributed push NAME [NAME ...]: which kernel variables?")
        missing = [name for name in args.names if name not in self._namespace()]
        if missing:
            raise UsageError(f"not defined in the kernel: {', '.join(missing)}")
        pool = self._running_pool(args)
        pool.push({name: self._namespace()[name] for name in args.names}, _ranks(args.ranks))

    def _pull(self, args: Any) -> list[Any]:
        if len(args.names) != 1:
            raise UsageError("%distributed pull NAME: one variable, returned as a per-rank list")
        pool = self._running_pool(args)
        return pool.pull(args.names[0], _ranks(args.ranks))


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext nb_accel``: register the ``%distributed`` / ``%%distributed`` magics."""
    ipython.register_magics(DistributedMagics)
