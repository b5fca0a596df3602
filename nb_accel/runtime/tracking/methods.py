"""The Accelerator's tracker methods: ``init_trackers``, ``log``, ``get_tracker``,
``end_training``.

``log`` always feeds the live chart in the cell (on every process) and, once
``init_trackers`` has started them, the trackers ``log_with`` named: on the main process only,
unless a tracker's ``main_process_only`` is false.
"""

from __future__ import annotations

import os
from typing import Any

from ..options import ProjectConfiguration
from ..sinks import current_sink
from ..state import PartialState
from .base import GeneralTracker
from .live_chart import LiveChartTracker
from .open_runs import finish_tracker, remember_tracker
from .registry import LOGGER_TYPE_TO_CLASS, filter_trackers

__all__ = ["TrackingMethods"]


def show_where(line: str) -> None:
    """Tell the user where a tracker writes: in a launch, a line the launch view keeps on
    show; elsewhere, a printed line."""
    sink = current_sink()
    if sink is None:
        print(f"nb_accel: {line}", flush=True)
    else:
        sink.note(line)


class TrackingMethods:
    """Mixin of :class:`Accelerator`: experiment trackers and the live chart."""

    project_configuration: ProjectConfiguration
    _partial: PartialState
    #: What ``log_with`` chose: tracker names and the trackers passed as objects.
    log_with: list[str | GeneralTracker]
    #: The trackers started on this process by :meth:`init_trackers`.
    trackers: list[GeneralTracker]

    def _init_tracking(self, log_with: Any) -> None:
        """Check ``log_with`` (names, installed libraries, a logging folder where needed)."""
        self.log_with = filter_trackers(log_with, self.logging_dir)
        self.trackers = []
        self._live_chart = LiveChartTracker()

    @property
    def logging_dir(self) -> str | os.PathLike[str] | None:
        """Where trackers that write files put them (``ProjectConfiguration.logging_dir``)."""
        return self.project_configuration.logging_dir

    def _build_tracker(
        self, entry: str | GeneralTracker, project_name: str, options: dict[str, Any]
    ) -> GeneralTracker | None:
        """The tracker for ``entry`` on this process, or ``None`` where it does not run."""
        is_main = self._partial.is_main_process
        if isinstance(entry, GeneralTracker):
            return entry if is_main or not entry.main_process_only else None
        tracker_class: Any = LOGGER_TYPE_TO_CLASS[entry]
        if tracker_class.main_process_only and not is_main:
            return None
        if tracker_class.requires_logging_directory:
            return tracker_class(project_name, self.logging_dir, **options)
        return tracker_class(project_name, **options)

    def init_trackers(
        self,
        project_name: str,
        config: dict[str, Any] | None = None,
        init_kwargs: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        """Start a run in each tracker of ``log_with`` (on the main process, unless a tracker
        says otherwise) and record ``config`` as its hyperparameters.

        Args:
            project_name: the project (TensorBoard's run folder, the W&B project, the MLflow
                experiment...).
            config: hyperparameters to store with the run.
            init_kwargs: options for a tracker's constructor by its name, e.g.
                ``{"wandb": {"name": "run-1"}, "tensorboard": {"flush_secs": 10}}``.
        """
        init_kwargs = init_kwargs or {}
        for entry in self.log_with:
            name = entry if isinstance(entry, str) else str(getattr(entry, "name", ""))
            tracker = self._build_tracker(entry, project_name, dict(init_kwargs.get(name, {})))
            if tracker is None:
                continue
            tracker.start()
            remember_tracker(tracker)
            self.trackers.append(tracker)
            where = tracker._where()
            if where is not None:
                show_where(f"{tracker.name} logs to {where}")
        if config is not None:
            for tracker in self.trackers:
                tracker.store_init_configuration(config)

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The tracker named ``name`` (with ``unwrap=True`` the library's own object: the
        ``SummaryWriter``, the ``wandb`` run, the ``mlflow.ActiveRun``...). On a process where
        that tracker does not run, a tracker that does nothing."""
        for tracker in [*self.trackers, self._live_chart]:
            if tracker.name == name:
                return tracker.tracker if unwrap else tracker
        known = {e if isinstance(e, str) else getattr(e, "name", None) for e in self.log_with}
        if name in known or not self.trackers:
            return GeneralTracker(_blank=True)
        raise ValueError(
            f"get_tracker({name!r}): no such tracker in this Accelerator "
            f"(it has {[t.name for t in self.trackers]})"
        )

    def log(
        self,
        values: dict[str, Any],
        step: int | None = None,
        log_kwargs: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        """Log ``values`` at ``step``: to the live chart in the cell, and to the trackers that
        :meth:`init_trackers` started (on the main process unless a tracker says otherwise).

        The chart draws numbers and one-element tensors (nested dicts as ``outer/inner``), one
        line per name, rank 0's by default, without reading a tensor on the training thread.
        Trackers get the values as Accelerate gives them (TensorBoard: numbers as scalars,
        text as text, dicts as grouped scalars), tensors read as numbers.
        ``log_kwargs={name: {...}}`` passes options to one tracker's ``log``.
        """
        self._live_chart.log(values, step)
        log_kwargs = log_kwargs or {}
        for tracker in self.trackers:
            tracker.log(values, step=step, **log_kwargs.get(tracker.name, {}))

    def end_training(self) -> None:
        """Finish every tracker's run (its files written and closed), once. Call it at the end
        of training; a worker that ends without it, or fails, finishes them on its way out.
        :attr:`trackers` still lists them afterwards."""
        for tracker in self.trackers:
            finish_tracker(tracker)
