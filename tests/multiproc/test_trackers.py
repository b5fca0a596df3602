"""Experiment trackers in a 2-process launch: one run per tracker (the main process's), the
other ranks log to the live chart only; a rank that fails finishes its runs on its way out."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from nb_accel import Accelerator, GeneralTracker, WorkerDiedError, notebook_launcher
from nb_accel.tracking import MLflowTracker

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
    assert mlflow_run["status"] == "KILLED"  # ended by the kernel once the rank was gone


class RunPerRank(MLflowTracker):
    """MLflow, with a run on every rank (each rank's own ``rank`` param)."""

    main_process_only = False


def fail_while_rank0_waits(folder: str, block_sigterm: bool) -> None:
    """Every rank opens an MLflow run; rank 0 then waits (a minute at most) with its marker
    written, SIGTERM held back when ``block_sigterm`` (as in a call that does not return to
    Python), and rank 1 raises once the marker is there."""
    accelerator = Accelerator(log_with=[RunPerRank("stopped")])
    accelerator.init_trackers("stopped", config={"rank": accelerator.process_index})
    accelerator.log({"loss": 1.0}, step=0)
    marker = Path(folder, "rank0-waiting")
    if accelerator.process_index == 0:
        if block_sigterm:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        marker.touch()
        threading.Event().wait(60)  # the launch stops it long before
        raise AssertionError("rank 0 was not stopped")
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    raise RuntimeError("rank 1 fails while rank 0 waits")


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("block_sigterm", "rank0_status"), [(True, "KILLED"), (False, "FAILED")])
def test_a_rank_stopped_after_another_failed_leaves_no_mlflow_run_running(
    tmp_path: Path,
    tracker_env: str,
    capsys: pytest.CaptureFixture[str],
    block_sigterm: bool,
    rank0_status: str,
) -> None:
    """Rank 1 fails while rank 0 waits; the launch stops rank 0. A rank 0 that can unwind
    ends its run as failed itself; one that cannot is killed, and the kernel ends its run as
    killed (MLflow's status for a run stopped from outside)."""
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=tracker_env).create_experiment("stopped")  # not made by 2 at once
    with pytest.raises(RuntimeError, match="rank 1 fails while rank 0 waits"):
        notebook_launcher(
            fail_while_rank0_waits, args=(str(tmp_path), block_sigterm), num_processes=2
        )
    statuses = {
        run["params"]["rank"]: run["status"] for run in tracker_files.mlflow_runs(tracker_env)
    }
    assert statuses == {"0": rank0_status, "1": "FAILED"}
    said = "rank 0 was stopped before it ended its mlflow run" in capsys.readouterr().err
    assert said == block_sigterm


@pytest.mark.timeout(240)
def test_a_pool_rank_killed_with_a_run_open_has_it_ended_when_the_pool_stops(
    tracker_env: str,
) -> None:
    """A ``%%distributed`` run stays open across cells; the rank holding it dies: stopping
    the pool ends the run as killed."""
    from nb_accel.launch.pool import WorkerPool

    pool = WorkerPool(2, cpu=True)
    pool.start()
    try:
        pool.execute(
            "from nb_accel import Accelerator\n"
            "accelerator = Accelerator(log_with='mlflow')\n"
            "accelerator.init_trackers('pool', config={'lr': 0.1})\n"
        )
        (run,) = tracker_files.mlflow_runs(tracker_env)
        assert run["status"] == "RUNNING"  # open across cells
        with pytest.raises(WorkerDiedError):
            pool.execute(
                "import os, signal\nif rank == 0:\n    os.kill(os.getpid(), signal.SIGKILL)\n"
            )
    finally:
        pool.stop()
    (run,) = tracker_files.mlflow_runs(tracker_env)
    assert run["status"] == "KILLED"
