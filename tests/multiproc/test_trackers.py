"""Experiment trackers in a 2-process launch: one run per tracker (the main process's), the
other ranks log to the live chart only; a rank that fails finishes its runs on its way out."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from nb_accel import Accelerator, GeneralTracker, WorkerDiedError, notebook_launcher

sys.path.insert(0, str(Path(__file__).parent))
import tracker_files

sys.path.remove(str(Path(__file__).parent))

TRACKERS = ["tensorboard", "mlflow", "wandb"]


@pytest.fixture(autouse=True, scope="module")
def unload_tracker_libraries() -> Iterator[None]:
    """The libraries this module's tests loaded are unloaded after them."""
    yield
    tracker_files.forget_tracker_libraries()


@pytest.fixture
def tracker_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """W&B offline and an MLflow SQLite store, everything in ``tmp_path`` (the workers
    inherit the environment); returns the MLflow URI."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        folder = tmp_path / name.lower()
        folder.mkdir()
        monkeypatch.setenv(name, str(folder))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    return uri


class EveryRank(GeneralTracker):
    """A tracker each process uses (``main_process_only = False``): one JSON-lines file per
    rank."""

    name = "every_rank"
    requires_logging_directory = False
    main_process_only = False

    def __init__(self, folder: str) -> None:
        super().__init__()
        self.folder = folder
        self.lines: list[str] = []

    @property
    def tracker(self) -> list[str]:
        """The lines."""
        return self.lines

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Keep a line."""
        self.lines.append(json.dumps({"step": step, "loss": float(values["loss"])}))

    def finish(self) -> None:
        """Write the lines to this rank's file."""
        rank = torch.distributed.get_rank()
        Path(self.folder, f"rank{rank}.jsonl").write_text("\n".join(self.lines))


def train_and_log(folder: str, fail_after: int | None = None) -> list[str]:
    """Log five steps (each rank its own loss) to three trackers and one of every rank's;
    with ``fail_after``, rank 0 raises after that many steps, without ``end_training``."""
    accelerator = Accelerator(log_with=[*TRACKERS, EveryRank(folder)], project_dir=folder)
    accelerator.init_trackers("two-ranks", config={"lr": 0.1, "ranks": 2})
    for step in range(5):
        if fail_after is not None and step == fail_after and accelerator.is_main_process:
            raise RuntimeError("stopped mid-run")
        loss = torch.tensor(float(step + 10 * accelerator.process_index))
        accelerator.log({"loss": loss}, step=step)
    names = [tracker.name for tracker in accelerator.trackers]
    # on rank 1, a tracker that does nothing (not an error)
    names.append(type(accelerator.get_tracker("tensorboard", unwrap=True)).__name__)
    if fail_after is None:
        accelerator.end_training()
    return names


@pytest.mark.timeout(240)
def test_two_ranks_three_trackers_one_run_each(
    tmp_path: Path, tracker_env: str, capsys: pytest.CaptureFixture[str]
) -> None:
    names = notebook_launcher(train_and_log, args=(str(tmp_path),), num_processes=2)
    assert names == [[*TRACKERS, "every_rank", "SummaryWriter"], ["every_rank", "GeneralTracker"]]
    # where each tracker writes: a line of the launch view (the text view writes to stderr)
    where = [line for line in capsys.readouterr().err.splitlines() if " logs to " in line]
    assert [line.split(" logs to ")[0] for line in where] == [
        f"nb_accel: {name}" for name in TRACKERS
    ]
    run = tmp_path / "two-ranks"
    assert len(list(run.glob("events.out.tfevents*"))) == 1
    assert tracker_files.tensorboard_scalars(run) == {"loss": [(s, float(s)) for s in range(5)]}
    (mlflow_run,) = tracker_files.mlflow_runs(tracker_env)
    assert mlflow_run["status"] == "FINISHED"
    assert mlflow_run["params"] == {"lr": "0.1", "ranks": "2"}
    assert mlflow_run["metrics"] == {"loss": [(s, float(s)) for s in range(5)]}
    (wandb_folder,) = (tmp_path / "wandb_dir" / "wandb").glob("offline-run-*")
    wandb_run = tracker_files.wandb_run(wandb_folder)
    assert [row["loss"] for row in wandb_run["history"]] == [0, 1, 2, 3, 4]
    assert wandb_run["exit_code"] == 0
    for rank in (0, 1):
        lines = (tmp_path / f"rank{rank}.jsonl").read_text().splitlines()
        assert [json.loads(line)["loss"] for line in lines] == [s + 10.0 * rank for s in range(5)]


@pytest.mark.timeout(240)
def test_a_failed_rank_finishes_its_runs_as_failed(tmp_path: Path, tracker_env: str) -> None:
    with pytest.raises(RuntimeError, match="stopped mid-run"):
        notebook_launcher(train_and_log, args=(str(tmp_path), 3), num_processes=2)
    run = tmp_path / "two-ranks"
    assert tracker_files.tensorboard_scalars(run) == {"loss": [(s, float(s)) for s in range(3)]}
    (mlflow_run,) = tracker_files.mlflow_runs(tracker_env)
    assert mlflow_run["status"] == "FAILED"
    assert mlflow_run["metrics"] == {"loss": [(s, float(s)) for s in range(3)]}
    (wandb_folder,) = (tmp_path / "wandb_dir" / "wandb").glob("offline-run-*")
    wandb_run = tracker_files.wandb_run(wandb_folder)
    assert [row["loss"] for row in wandb_run["history"]] == [0, 1, 2]
    assert wandb_run["exit_code"] == 1


def log_then_die(folder: str) -> None:
    """Log three steps, wait (at most a minute) for TensorBoard's writer to write them out by
    itself, then rank 0 dies at once (SIGKILL: no exit path runs)."""
    accelerator = Accelerator(log_with=TRACKERS, project_dir=folder)
    accelerator.init_trackers("killed", config={"lr": 0.1})
    for step in range(3):
        accelerator.log({"loss": float(step)}, step=step)
    if accelerator.is_main_process:
        run = Path(folder) / "killed"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(tracker_files.tensorboard_scalars(run)) == 0:
            time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)
    accelerator.wait_for_everyone()


@pytest.mark.timeout(240)
def test_a_killed_rank_leaves_readable_runs(tmp_path: Path, tracker_env: str) -> None:
    with pytest.raises(WorkerDiedError):
        notebook_launcher(log_then_die, args=(str(tmp_path),), num_processes=2)
    scalars = tracker_files.tensorboard_scalars(tmp_path / "killed")
    assert scalars == {"loss": [(s, float(s)) for s in range(3)]}  # written within seconds
    (mlflow_run,) = tracker_files.mlflow_runs(tracker_env)
    assert mlflow_run["metrics"] == {"loss": [(s, float(s)) for s in range(3)]}
    assert mlflow_run["params"] == {"lr": "0.1"}
