"""The launcher interface: start the worker group, hear it out, give the outcome, stop it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from ..._messages import TrackerRun
from ..views.view import LaunchView
from .left_open_runs import end_runs_left_open

__all__ = ["Launcher", "run_launch"]


class Launcher(ABC):
    """One way of running a launch's ranks (on this machine, across nodes, on XLA devices, as
    a persistent pool).

    The workers' events go to the launcher's
    :class:`~nb_accel.launch.launchers.dispatch.EventDispatcher`, which shows them on
    :attr:`view` and keeps the results and failures.
    """

    #: The launch's view (held output is written before each change of a rank's state).
    view: LaunchView

    @abstractmethod
    def start(self) -> None:
        """Start the worker group with the launch's payload."""

    @abstractmethod
    def wait(self) -> Any:
        """Pass the workers' events on until the outcome is known, and return it: the ranks'
        results in rank order, or the exception the caller raises."""

    @abstractmethod
    def stop(self, graceful: bool = False) -> None:
        """Stop every worker and release what the launch holds; with ``graceful`` (the
        launch succeeded) the workers are first given time to exit on their own."""

    def runs_left_open(self) -> list[TrackerRun]:
        """The tracker runs the ranks opened and did not say they ended (asked once every
        worker is gone); none where the launcher cannot end them from here (the default)."""
        return []


def run_launch(launcher: Launcher) -> Any:
    """Run one launch: start, wait for the outcome, tell the view how it ended, stop.

    Returns the outcome (the results, or the exception to raise); whatever ends it
    (``KeyboardInterrupt`` included), no worker is left behind, and a tracker run a stopped
    rank left open is ended.
    """
    succeeded = False
    try:
        launcher.start()
        outcome = launcher.wait()
        succeeded = not isinstance(outcome, BaseException)
        return outcome
    finally:
        try:
            launcher.view.finished(succeeded)  # the held output first
        finally:
            launcher.stop(graceful=succeeded)
            end_runs_left_open(launcher.runs_left_open())
