"""MLflow: one run in the experiment named after the project (the tracking URI is MLflow's own:
``MLFLOW_TRACKING_URI``, ``mlflow.set_tracking_uri``, or its default)."""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

from ..._flags import env_flag
from .base import GeneralTracker, flat_numbers, on_main_process, plain_values

__all__ = ["MLflowTracker"]


class MLflowTracker(GeneralTracker):
    """Logs to an MLflow run. ``MLFLOW_EXPERIMENT_NAME``, ``MLFLOW_RUN_ID``, ``MLFLOW_TAGS``
    (JSON) and ``MLFLOW_NESTED_RUN`` take precedence over the arguments of the same meaning.

    Args:
        experiment_name: the experiment (the ``project_name`` of ``init_trackers``); created
            when it does not exist.
        logging_dir: the artifact location of a new experiment.
        run_id: continue this run instead of starting one.
        tags: the run's tags (a dict, or its JSON text).
        nested_run: start the run nested in the active one.
        run_name: the new run's name.
        description: the run's description.
    """

    name = "mlflow"
    requires_logging_directory = False

    def __init__(
        self,
        experiment_name: str | None = None,
        logging_dir: str | os.PathLike[str] | None = None,
        run_id: str | None = None,
        tags: dict[str, Any] | str | None = None,
        nested_run: bool = False,
        run_name: str | None = None,
        description: str | None = None,
    ) -> None:
        super().__init__()
        self.experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", experiment_name)
        self.logging_dir = None if logging_dir is None else os.fspath(logging_dir)
        self.run_id = os.environ.get("MLFLOW_RUN_ID", run_id)
        raw_tags = os.environ.get("MLFLOW_TAGS", tags)
        self.tags: dict[str, Any] | None = (
            json.loads(raw_tags) if isinstance(raw_tags, str) else raw_tags
        )
        nested = env_flag("MLFLOW_NESTED_RUN", hint="use true or false")
        self.nested_run = bool(nested_run) if nested is None else nested
        self.run_name = run_name
        self.description = description
        self.active_run: Any = None
        self._warned: set[str] = set()

    @on_main_process
    def start(self) -> None:
        """Find or create the experiment and start (or resume) the run."""
        import mlflow

        found = mlflow.search_experiments(filter_string=f"name = '{self.experiment_name}'")
        if found:
            experiment_id = found[0].experiment_id
        else:
            experiment_id = mlflow.create_experiment(
                name=str(self.experiment_name), artifact_location=self.logging_dir, tags=self.tags
            )
        self.active_run = mlflow.start_run(
            run_id=self.run_id,
            experiment_id=experiment_id,
            run_name=self.run_name,
            nested=self.nested_run,
            tags=self.tags,
            description=self.description,
        )

    def _where(self) -> str | None:
        """The run, its experiment and the tracking URI."""
        if self.active_run is None:
            return None
        import mlflow

        info = self.active_run.info
        return (
            f"run {info.run_name!r} ({info.run_id}) of experiment {self.experiment_name!r} "
            f"at {mlflow.get_tracking_uri()}"
        )

    @property
    def tracker(self) -> Any:
        """The ``mlflow.ActiveRun``."""
        return self.active_run

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Log ``values`` as the run's params (MLflow keeps them as text; a value longer than
        MLflow allows is left out with a warning)."""
        import mlflow
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        params: list[tuple[str, Any]] = []
        for key, value in plain_values(values).items():
            if len(str(value)) > MAX_PARAM_VAL_LENGTH:
                warnings.warn(
                    f"MLflow keeps params of at most {MAX_PARAM_VAL_LENGTH} characters: "
                    f"{key!r} is left out of the run's params",
                    stacklevel=3,
                )
                continue
            params.append((key, value))
        for first in range(0, len(params), MAX_PARAMS_TAGS_PER_BATCH):
            mlflow.log_params(dict(params[first : first + MAX_PARAMS_TAGS_PER_BATCH]))

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Log the numbers as metrics (tensors read first, nested dicts as ``outer/inner``);
        other values are left out, with a warning the first time for each name."""
        plain = plain_values(values)
        metrics = flat_numbers(plain)
        for key, value in plain.items():
            if key not in metrics and not isinstance(value, dict) and key not in self._warned:
                self._warned.add(key)
                warnings.warn(
                    f"MLflow metrics are numbers: {key!r} ({type(value).__name__}) is not logged",
                    stacklevel=3,
                )
        if metrics:
            import mlflow

            mlflow.log_metrics(metrics, step=step, **kwargs)

    @on_main_process
    def log_figure(self, figure: Any, artifact_file: str, **save_kwargs: Any) -> None:
        """Save a matplotlib or plotly ``figure`` as the run's artifact ``artifact_file``."""
        import mlflow

        mlflow.log_figure(figure=figure, artifact_file=artifact_file, **save_kwargs)

    @on_main_process
    def log_artifacts(self, local_dir: str, artifact_path: str | None = None) -> None:
        """Copy the folder ``local_dir`` into the run's artifacts (under ``artifact_path``)."""
        import mlflow

        mlflow.log_artifacts(local_dir=local_dir, artifact_path=artifact_path)

    @on_main_process
    def log_artifact(self, local_path: str, artifact_path: str | None = None) -> None:
        """Copy the file ``local_path`` into the run's artifacts (under ``artifact_path``)."""
        import mlflow

        mlflow.log_artifact(local_path=local_path, artifact_path=artifact_path)

    @on_main_process
    def finish(self) -> None:
        """End the run."""
        self._end("FINISHED")

    def _finish_after_failure(self) -> None:
        """End the run as failed."""
        self._end("FAILED")

    def _run_reference(self) -> tuple[str, str] | None:
        """The run's id and the tracking URI it is kept at."""
        if self.active_run is None:
            return None
        import mlflow

        return self.active_run.info.run_id, mlflow.get_tracking_uri()

    @classmethod
    def _end_left_open(cls, run_id: str, location: str) -> bool:
        """End the run as ``KILLED`` (MLflow's status for a run stopped from outside) if it is
        still ``RUNNING``."""
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=location)
        if client.get_run(run_id).info.status != "RUNNING":
            return False
        client.set_terminated(run_id, status="KILLED")
        return True

    def _end(self, status: str) -> None:
        if self.active_run is None:
            return
        import mlflow

        self.active_run = None
        mlflow.end_run(status=status)
