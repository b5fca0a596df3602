"""The single-node launcher: one worker process per rank on this machine, watched together.

The workers are started by fork, forkserver or spawn (:mod:`.workers`) with the launch's
function, and meet through a file store in a scratch folder. They are this machine's ranks
(:class:`~nb_accel.launch.pool_ranks.launched.LaunchedRanks`) whose one command is that
function: the one driver (:class:`~nb_accel.launch.driver.driver.RankDriver`) runs it to its
outcome, as it runs a warm launch or a cell on kept ranks, and the ranks are stopped after it.
"""

from __future__ import annotations

import contextlib
from typing import Any, ClassVar

from .._messages import TrackerRun
from .debugging.prompts import prompt_clock
from .driver.driver import RankDriver
from .launchers.backend import LaunchBackend
from .launchers.outcome import load_result
from .pool_ranks.launched import LaunchedRanks
from .processes import WorkerProcess, multiprocessing_helpers
from .request import LaunchCall
from .scratch import make_scratch_dir
from .spec import LaunchSpec
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
        self._ranks: LaunchedRanks | None = None
        self._helpers = contextlib.ExitStack()

    def start(self) -> None:
        """Start one worker per rank (those started are stopped if a later one fails)."""
        plan = self._plan
        self._helpers.enter_context(multiprocessing_helpers(plan.start_method))
        folder = make_scratch_dir("launch")
        # time at prompts leaves the ranks' timeout
        clock = self._helpers.enter_context(prompt_clock(folder))
        workers: list[WorkerProcess] = []
        try:
            start_workers(plan, folder, self.payload, workers, clock)
        finally:  # the ranks own the workers, the folder and the helpers from here
            helpers, self._helpers = self._helpers, contextlib.ExitStack()
            self._ranks = LaunchedRanks(workers, plan, folder, helpers, self.printer, clock)

    def wait(self) -> list[Any] | BaseException:
        """Until every rank returned or one failed: the results in rank order, or the
        exception to raise (the ranks are stopped already then)."""
        ranks = self._ranks
        assert ranks is not None, "start() first"
        plan = self._plan
        driver = RankDriver(
            ranks,
            plan.num_processes,
            plan.timeout_s,
            plan.device.detached_collectives(plan.backend),
            give_up=lambda why: None,  # a launch's ranks are stopped after it anyway
        )
        outcome = driver.run_started(self.view)
        if isinstance(outcome, BaseException):
            ranks.stop()  # their last words, before the outcome is told
            return outcome
        return [load_result(rank, reply.value or b"") for rank, reply in sorted(outcome.items())]

    def stop(self, graceful: bool = False) -> None:
        """Stop and reap every worker, show what they wrote on their way out, and remove the
        launch's scratch folder (with the rank kept for ``%debug``, if one is)."""
        try:
            if self._ranks is not None:
                self._ranks.stop(graceful=graceful)
            self.printer.flush()  # what the workers wrote to their descriptors on their way out
        finally:
            self._helpers.close()

    def runs_left_open(self) -> list[TrackerRun]:
        """The tracker runs the ranks opened and were not heard ending."""
        return [] if self._ranks is None else list(self._ranks.events.open_runs.values())
