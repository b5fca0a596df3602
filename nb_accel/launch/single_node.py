"""The single-node launcher: one worker process per rank on this machine, watched together.

The workers are started by fork, forkserver or spawn (:mod:`.workers`) and meet through a
file store in a scratch folder; :class:`~nb_accel.launch.supervisor.WorkerGroup` hears their
events and exits until every rank returned or one failed.
"""

from __future__ import annotations

import shutil
from typing import Any

from .._messages import TrackerRun
from .launchers.interface import Launcher
from .payload import LaunchPayload
from .plan import LaunchPlan
from .processes import WorkerProcess
from .scratch import make_scratch_dir
from .supervisor import WorkerGroup
from .views.output import OutputPrinter
from .views.view import LaunchView
from .workers import start_workers

__all__ = ["SingleNodeLauncher"]


class SingleNodeLauncher(Launcher):
    """Runs ``payload`` on ``plan.num_processes`` worker processes of this machine.

    Args:
        plan: the launch's plan.
        payload: the function and its arguments: the call itself, which forked workers
            inherit, or pickled.
        prefix_output: prefix each line of output with its rank.
        view: the launch's view.
        prefix_template: a ``log_line_prefix_template`` for those prefixes (``None``: the
            rank's).
    """

    def __init__(
        self,
        plan: LaunchPlan,
        payload: LaunchPayload,
        prefix_output: bool,
        view: LaunchView,
        prefix_template: str | None = None,
    ) -> None:
        self._plan = plan
        self._payload = payload
        self._printer = OutputPrinter(
            plan.num_processes, prefix_output, view=view, template=prefix_template
        )
        self.view = self._printer.view  # the held output first at each change of state
        self._workers: list[WorkerProcess] = []
        self._group: WorkerGroup | None = None
        self._store_dir: str | None = None

    def start(self) -> None:
        """Start one worker per rank (those started are stopped if a later one fails)."""
        self._store_dir = make_scratch_dir("launch")
        start_workers(self._plan, self._store_dir, self._payload, self._workers)
        printer = self._printer
        self._group = WorkerGroup(
            self._workers,
            printer,
            self._plan.timeout_s,
            self.view,
            flush_output=printer.flush_due,
            folder=self._store_dir,
        )

    def wait(self) -> list[Any] | BaseException:
        """Until every rank returned or one failed: the results in rank order, or the
        exception to raise."""
        assert self._group is not None, "start() first"
        return self._group.wait()

    def stop(self, graceful: bool = False) -> None:
        """Stop and reap every worker, show what they wrote on their way out, and remove the
        launch's scratch folder."""
        group = self._group or WorkerGroup(self._workers, self._printer, self._plan.timeout_s)
        group.stop(graceful=graceful)
        self._printer.flush()  # what the workers wrote to their descriptors on their way out
        if self._store_dir is not None:
            shutil.rmtree(self._store_dir, ignore_errors=True)

    def runs_left_open(self) -> list[TrackerRun]:
        """The tracker runs the ranks opened and were not heard ending."""
        return [] if self._group is None else list(self._group.events.open_runs.values())
