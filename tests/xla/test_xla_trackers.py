"""An XLA worker finishes the trackers its function left open: after the function raised, its
MLflow run ends ``FAILED`` and the TensorBoard events it logged can be read."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch_xla")
pytest.importorskip("mlflow")
pytest.importorskip("tensorboard")

from nb_accel import Accelerator, WorkerDiedError, notebook_launcher

sys.path.insert(0, str(Path(__file__).parents[1] / "multiproc"))
import tracker_files

sys.path.remove(str(Path(__file__).parents[1] / "multiproc"))

LOGGED = {"loss": [(0, 0.0), (1, 1.0), (2, 2.0)]}


@pytest.fixture(autouse=True, scope="module")
def unload_tracker_libraries() -> Iterator[None]:
    """The libraries this module's tests loaded are unloaded after them."""
    yield
    tracker_files.forget_tracker_libraries()


def log_then_fail(folder: str) -> None:
    """TensorBoard and MLflow runs of three steps; then the function raises, without ending
    them."""
    accelerator = Accelerator(log_with=["tensorboard", "mlflow"], project_dir=folder)
    accelerator.init_trackers("xla", config={"lr": 0.1})
    for step in range(3):
        accelerator.log({"loss": float(step)}, step=step)
    raise RuntimeError("stopped mid-run")


@pytest.mark.timeout(240)
def test_a_failed_xla_rank_finishes_its_trackers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    with pytest.raises(RuntimeError, match="stopped mid-run"):
        notebook_launcher(log_then_fail, args=(str(tmp_path),), show_progress=False)
    assert tracker_files.tensorboard_scalars(tmp_path / "xla") == LOGGED
    (run,) = tracker_files.mlflow_runs(uri)
    assert run["status"] == "FAILED"
    assert run["metrics"] == LOGGED
    assert run["params"] == {"lr": "0.1"}


def log_then_die() -> None:
    """An MLflow run of one step; then the worker dies at once (SIGKILL: no exit path runs)."""
    import os
    import signal

    accelerator = Accelerator(log_with="mlflow")
    accelerator.init_trackers("xla-killed", config={"lr": 0.1})
    accelerator.log({"loss": 0.0}, step=0)
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.timeout(240)
def test_a_killed_xla_rank_s_run_is_ended_by_the_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    with pytest.raises(WorkerDiedError):
        notebook_launcher(log_then_die, show_progress=False)
    (run,) = tracker_files.mlflow_runs(uri)
    assert run["status"] == "KILLED"
    assert "rank 0 was stopped before it ended its mlflow run" in capsys.readouterr().err
