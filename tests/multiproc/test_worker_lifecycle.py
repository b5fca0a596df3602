"""Every worker finishes the trackers its function left open, on every way out: after a rank
failed, its MLflow run ends ``FAILED`` and the TensorBoard events it logged can be read, in a
single-node launch and in a launch over two nodes (two node processes on this machine, as in
``test_multinode.py``), and also when the rank holding the runs is stopped because another
failed. A rank killed outright cannot end its run: the kernel of its node does (the SSH hosts'
nodes do the same, in ``test_hosts_ssh.py``). The XLA lane checks the same in ``tests/xla``."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nb_accel import Accelerator, notebook_launcher

sys.path.insert(0, str(Path(__file__).parent))
import tracker_files
from multinode_node import TRACKERS_FOLDER, log_then_fail
from test_multinode import _two_nodes

sys.path.remove(str(Path(__file__).parent))

LOGGED = {"loss": [(0, 0.0), (1, 1.0), (2, 2.0)]}


@pytest.fixture(autouse=True, scope="module")
def unload_tracker_libraries() -> Iterator[None]:
    """The libraries this module's tests loaded are unloaded after them."""
    yield
    tracker_files.forget_tracker_libraries()


@pytest.fixture
def mlflow_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An MLflow store in ``tmp_path`` (the workers inherit the environment)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    return uri


def _assert_finished_as_failed(run_folder: Path, mlflow_uri: str) -> None:
    assert tracker_files.tensorboard_scalars(run_folder) == LOGGED
    (run,) = tracker_files.mlflow_runs(mlflow_uri)
    assert run["status"] == "FAILED"
    assert run["metrics"] == LOGGED
    assert run["params"] == {"lr": "0.1"}


@pytest.mark.timeout(240)
def test_a_failed_rank_finishes_its_trackers_on_one_node(tmp_path: Path, mlflow_uri: str) -> None:
    with pytest.raises(RuntimeError, match="stopped mid-run"):
        notebook_launcher(log_then_fail, args=(str(tmp_path), "one-node"), num_processes=2)
    _assert_finished_as_failed(tmp_path / "one-node", mlflow_uri)


@pytest.mark.timeout(300)
def test_a_failed_rank_finishes_its_trackers_on_two_nodes(tmp_path: Path, mlflow_uri: str) -> None:
    env = {TRACKERS_FOLDER: str(tmp_path)}
    node0, node1 = _two_nodes(tmp_path, "trackers", "num_nodes=2", env=env)
    for node in (node0, node1):
        assert node.get("error") == "RuntimeError", node
        assert node["message"] == "stopped mid-run", node
    _assert_finished_as_failed(tmp_path / "two-nodes", mlflow_uri)


@pytest.mark.timeout(300)
def test_a_killed_rank_s_run_is_ended_by_its_own_node_s_kernel(
    tmp_path: Path, mlflow_uri: str
) -> None:
    """Rank 3 (node 1) is killed with its MLflow run open: node 1's kernel ends that run as
    killed; the other ranks end theirs as failed on their way out, or, where their node's agent
    stopped them on it (a second's grace, on a loaded machine), their kernel ends it as killed:
    no run is left running."""
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=mlflow_uri).create_experiment("killed")  # not made by 4 at once
    node0, node1 = _two_nodes(tmp_path, "killed_run", "num_nodes=2")
    assert node1.get("error") == "WorkerDiedError", node1
    assert "error" in node0, node0  # its ranks lost their peer
    runs = tracker_files.mlflow_runs(mlflow_uri)
    statuses = {run["params"]["rank"]: run["status"] for run in runs}
    assert sorted(statuses) == ["0", "1", "2", "3"] and statuses["3"] == "KILLED", statuses
    assert {statuses[rank] for rank in "012"} <= {"FAILED", "KILLED"}, statuses


def log_then_wait_for_a_failure(folder: str) -> None:
    """The main process logs three steps, then waits in Python (not in a collective) while
    rank 1 fails: the launch stops it with SIGTERM, in the middle of its function."""
    accelerator = Accelerator(log_with=["tensorboard", "mlflow"], project_dir=folder)
    accelerator.init_trackers("stopped", config={"lr": 0.1})
    for step in range(3):
        accelerator.log({"loss": float(step)}, step=step)
    accelerator.wait_for_everyone()  # the runs are written before rank 1 fails
    if accelerator.is_main_process:
        time.sleep(120)  # stopped long before
    raise RuntimeError("rank 1 failed")


@pytest.mark.timeout(240)
def test_a_rank_stopped_after_another_failed_finishes_its_trackers(
    tmp_path: Path, mlflow_uri: str
) -> None:
    with pytest.raises(RuntimeError, match="rank 1 failed") as raised:
        notebook_launcher(log_then_wait_for_a_failure, args=(str(tmp_path),), num_processes=2)
    assert "rank 1" in "\n".join(getattr(raised.value, "__notes__", []))
    _assert_finished_as_failed(tmp_path / "stopped", mlflow_uri)
