"""A cold launch's ranks on this machine: worker processes started with the launch's function,
which is their one command (command 0), stopped once it has ended.

They are this machine's ranks as a pool's are (:class:`~.local.LocalRanks`), run by the same
driver (:mod:`~nb_accel.launch.driver.driver`); what differs is said here: a rank replies to
its command with its result or failure; a rank that ends without either died; the failures are
judged as they arrive, on the launch's view; the ranks still running when the verdict is known
are not freed but stopped, and the rank that raised may be kept for ``%debug``.
"""

from __future__ import annotations

import contextlib

from ..._messages import Failure, Result
from ..failures.failure_log import FailureLog
from ..launchers.outcome import RETURNED
from ..plan import LaunchPlan
from ..processes import WorkerProcess
from ..views.output import OutputPrinter
from ..views.view import LaunchView
from .interface import reply_of_outcome
from .local import LocalRanks

__all__ = ["LaunchedRanks"]


class LaunchedRanks(LocalRanks):
    """The worker processes of one cold launch on this machine.

    Args:
        workers: the started workers, in rank order.
        plan: the launch's plan.
        folder: the launch's folder (its store, stacks and shared buffers).
        helpers: what the start method holds open (closed when the ranks stop).
        printer: writes the workers' output; its view is the launch's.
        clock: the launch's prompt clock file.
    """

    keeps = False
    replaces_dead_ranks = False
    finished_as = RETURNED

    def __init__(
        self,
        workers: list[WorkerProcess],
        plan: LaunchPlan,
        folder: str,
        helpers: contextlib.ExitStack,
        printer: OutputPrinter,
        clock: str = "",
    ) -> None:
        super().__init__(
            workers,
            plan,
            folder,
            helpers,
            clock=clock,
            view=printer.view,
            post_mortem_s=plan.post_mortem_s,
        )
        self.output.printer = printer
        self.cell = 0  # the function the ranks were started with

    def ended(self, event: Result | Failure) -> None:
        """A rank's reply to its command: its result, or its failure (a failure another rank
        relays for it counts as its reply too, as its first)."""
        reply_of_outcome(self.done, self.cell, event)

    def dead_ranks(self) -> list[int]:
        """Ranks whose worker ended without a reply (its death is among the failures)."""
        return sorted(rank for rank in self._exited if rank not in self.done)

    def collect_window(self, targets: list[int], dead: list[int]) -> float:
        """The failures' own window: a death too is judged with what the others report."""
        return self.events.failures.collect_window

    def command_failures(
        self, targets: list[int], stopped: list[int], view: LaunchView | None
    ) -> FailureLog:
        """The failures as they arrived, on the launch's view all along."""
        return self.events.failures
