"""The single-node launcher: one worker process per rank on this machine, watched together.

The workers are started by fork, forkserver or spawn (:mod:`.workers`) and meet through a
file store in a scratch folder; :class:`~nb_accel.launch.supervisor.WorkerGroup` hears their
events and exits until every rank returned or one failed.
"""

from __future__ import annotations

import contextlib
import shutil
from typing import Any, ClassVar

from .._messages import TrackerRun
from .debugging.prompts import prompt_clock
from .launchers.backend import LaunchBackend
from .processes import WorkerProcess, multiprocessing_helpers
from .request import LaunchCall
from .scratch import make_scratch_dir
from .spec import LaunchSpec
from .supervisor import WorkerGroup
from .workers import start_workers

__all__ = ["SingleNodeLauncher"]


class SingleNodeLauncher(LaunchBackend):
    """Runs a launch's ranks as worker processes of this machine, each watched directly
    (no rendezvous, no elastic agent)."""

    name: ClassVar[str] = "single_node"

    @classmethod
    def runs(cls, spec: LaunchSpec) -> bool:
        """Every launch on this machine alone whose workers are not restarted after a failure
        (with ``max_restarts``, torch's elastic agent runs them: see ``NodesLauncher``)."""
        nodes = spec.nodes
        return (
            spec.device.launcher is None
            and spec.hosts is None
            and not nodes.multi_node
            and nodes.max_restarts == 0
        )

    def __init__(self, spec: LaunchSpec, call: LaunchCall) -> None:
        super().__init__(spec, call)
        self._plan = spec.plan
        self._workers: list[WorkerProcess] = []
        self._group: WorkerGroup | None = None
        self._store_dir: str | None = None
        self._helpers = contextlib.ExitStack()

    def start(self) -> None:
        """Start one worker per rank (those started are stopped if a later one fails)."""
        self._helpers.enter_context(multiprocessing_helpers(self._plan.start_method))
        self._store_dir = make_scratch_dir("launch")
        # time at prompts leaves the ranks' timeout
        clock = self._helpers.enter_context(prompt_clock(self._store_dir))
        start_workers(self._plan, self._store_dir, self.payload, self._workers, clock)
        printer = self.printer
        self._group = WorkerGroup(
            self._workers,
            printer,
            self._plan.timeout_s,
            self.view,
            flush_output=printer.flush_due,
            folder=self._store_dir,
            post_mortem_s=self._plan.post_mortem_s,
        )

    def wait(self) -> list[Any] | BaseException:
        """Until every rank returned or one failed: the results in rank order, or the
        exception to raise."""
        assert self._group is not None, "start() first"
        return self._group.wait()

    def stop(self, graceful: bool = False) -> None:
        """Stop and reap every worker, show what they wrote on their way out, and remove the
        launch's scratch folder (once the rank kept for ``%debug`` is let go, if one is: its
        process group's store is in it, and torch's file store waits out the launch's timeout
        on every use once its file is gone)."""
        try:
            group = self._group or WorkerGroup(self._workers, self.printer, self._plan.timeout_s)
            group.stop(graceful=graceful)
            self.printer.flush()  # what the workers wrote to their descriptors on their way out
            if self._store_dir is not None:
                if group.kept_rank is not None:  # its process group still uses the store
                    group.kept_rank.remove_with_it(self._store_dir)
                else:
                    shutil.rmtree(self._store_dir, ignore_errors=True)
        finally:
            self._helpers.close()

    def runs_left_open(self) -> list[TrackerRun]:
        """The tracker runs the ranks opened and were not heard ending."""
        return [] if self._group is None else list(self._group.events.open_runs.values())
