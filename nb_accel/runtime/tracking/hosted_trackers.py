"""Trackers whose runs live in a service (or its offline files): trackio, Comet, SwanLab,
ClearML. Each imports its library only when its run starts."""

from __future__ import annotations

import os
import warnings
from typing import Any

from .base import GeneralTracker, flat_numbers, on_main_process, plain_values
from .init_run import InitRunTracker

__all__ = ["ClearMLTracker", "CometMLTracker", "SwanLabTracker", "TrackioTracker"]


class TrackioTracker(InitRunTracker):
    """Logs to a trackio run (``trackio.init(project=run_name, **kwargs)``)."""

    name = "trackio"
    _module = "trackio"


class SwanLabTracker(InitRunTracker):
    """Logs to a SwanLab run (``swanlab.init(project=run_name, **kwargs)``)."""

    name = "swanlab"
    _module = "swanlab"


class CometMLTracker(GeneralTracker):
    """Logs to a Comet experiment (``comet_ml.start(project_name=run_name, **kwargs)``; the
    API key comes from Comet's own configuration)."""

    name = "comet_ml"
    requires_logging_directory = False

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.writer: Any = None

    @on_main_process
    def start(self) -> None:
        """Start the experiment."""
        import comet_ml

        self.writer = comet_ml.start(project_name=self.run_name, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        """The Comet experiment."""
        return self.writer

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Log ``values`` as the experiment's parameters."""
        self.writer.log_parameters(plain_values(values))

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Numbers as metrics, text as "other" values, a dict as several metrics."""
        if step is not None:
            self.writer.set_step(step)
        for key, value in plain_values(values).items():
            if isinstance(value, (int, float)):
                self.writer.log_metric(key, value, step=step, **kwargs)
            elif isinstance(value, str):
                self.writer.log_other(key, value, **kwargs)
            elif isinstance(value, dict):
                self.writer.log_metrics(value, step=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        """End the experiment."""
        if self.writer is not None:
            writer, self.writer = self.writer, None
            writer.end()


class ClearMLTracker(GeneralTracker):
    """Logs to a ClearML task (``Task.init``; ``CLEARML_PROJECT`` and ``CLEARML_TASK`` name it
    before ``run_name`` does). A task already running in the process is used, and left open."""

    name = "clearml"
    requires_logging_directory = False

    def __init__(self, run_name: str | None = None, **kwargs: Any) -> None:
        super().__init__()
        self.user_provided_run_name = run_name
        self.init_kwargs = kwargs
        self.task: Any = None
        self._external = False

    @on_main_process
    def start(self) -> None:
        """Use the current task or start one."""
        from clearml import Task

        current = Task.current_task()
        if current is not None:
            self.task, self._external = current, True
            return
        options = dict(self.init_kwargs)
        name = self.user_provided_run_name
        options.setdefault("project_name", os.environ.get("CLEARML_PROJECT", name))
        options.setdefault("task_name", os.environ.get("CLEARML_TASK", name))
        # ClearML reports from an os.fork()ed process by default on Linux, forked while its
        # repository-detection thread starts `git`: a fork at that moment holds the pipe that
        # subprocess waits on, and closing the task then waits forever. A worker reports from
        # its own threads instead.
        if not hasattr(Task, "_report_subprocess_enabled"):
            import clearml

            warnings.warn(
                f"clearml {getattr(clearml, '__version__', '?')} has no "
                "Task._report_subprocess_enabled, with which a worker's task reports from its "
                "own threads: closing the task may hang; set "
                "sdk.development.report_use_subprocess: false in clearml.conf",
                stacklevel=2,
            )
        Task._report_subprocess_enabled = False
        self.task = Task.init(**options)

    @property
    def tracker(self) -> Any:
        """The ClearML task."""
        return self.task

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> Any:
        """Connect ``values`` to the task as its configuration."""
        return self.task.connect_configuration(plain_values(values))

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Numbers as scalars at ``step`` (as single values without one); a name starting with
        ``train_``, ``eval_`` or ``test_`` goes to that series, others to ``train``."""
        reporter = self.task.get_logger()
        for key, value in flat_numbers(plain_values(values)).items():
            if step is None:
                reporter.report_single_value(name=key, value=value, **kwargs)
                continue
            title, series = _title_series(key)
            reporter.report_scalar(
                title=title, series=series, value=value, iteration=step, **kwargs
            )

    @on_main_process
    def log_images(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Each value an image (array or PIL image), reported at ``step``."""
        reporter = self.task.get_logger()
        for key, image in values.items():
            title, series = _title_series(key)
            reporter.report_image(title=title, series=series, iteration=step, image=image, **kwargs)

    @on_main_process
    def log_table(
        self,
        table_name: str,
        columns: list[str] | None = None,
        data: list[list[Any]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
        **kwargs: Any,
    ) -> None:
        """Report a table: a ``dataframe``, or ``data`` rows (after a ``columns`` header)."""
        table = dataframe
        if table is None:
            if data is None:
                raise ValueError("ClearMLTracker.log_table needs `data` when `dataframe` is None")
            table = [columns, *data] if columns else data
        title, series = _title_series(table_name)
        self.task.get_logger().report_table(
            title=title, series=series, table_plot=table, iteration=step, **kwargs
        )

    @on_main_process
    def finish(self) -> None:
        """Close the task (unless it was started outside the Accelerator)."""
        if self.task is not None and not self._external:
            task, self.task = self.task, None
            task.close()


def _title_series(name: str) -> tuple[str, str]:
    for prefix in ("eval", "test", "train"):
        if name.startswith(prefix + "_"):
            return name[len(prefix) + 1 :], prefix
    return name, "train"
