"""Experiment trackers in one process, on the real libraries: what ``init_trackers``, ``log`` and
``end_training`` leave on disk, read back with each library's own reader."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from nb_accel import Accelerator, ProjectConfiguration
from nb_accel.tracking import (
    LOGGER_TYPE_TO_CLASS,
    GeneralTracker,
    MissingTrackerLibraryError,
    TensorBoardTracker,
    register_tracker_class,
)
from nb_accel.utils import LoggerType

_spec = importlib.util.spec_from_file_location(
    "tracker_files", Path(__file__).parents[1] / "multiproc" / "tracker_files.py"
)
assert _spec is not None and _spec.loader is not None
tracker_files = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tracker_files)


@pytest.fixture(autouse=True, scope="module")
def unload_tracker_libraries() -> Iterator[None]:
    """The libraries this module's tests loaded are unloaded after them."""
    yield
    tracker_files.forget_tracker_libraries()


@pytest.fixture
def offline_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """W&B offline, every folder it writes in ``tmp_path``."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        folder = tmp_path / name.lower()
        folder.mkdir()
        monkeypatch.setenv(name, str(folder))
    return tmp_path / "wandb_dir" / "wandb"


@pytest.fixture
def mlflow_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An MLflow SQLite store in ``tmp_path``, telemetry off (it would write to the home)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    return uri


def _losses(accelerator: Accelerator, steps: int = 4) -> None:
    for step in range(steps):
        accelerator.log(
            {
                "loss": torch.tensor(1.0 / (step + 1)),
                "lr": 0.1,
                "groups": {"train": float(step), "eval": torch.tensor(2.0 * step)},
                "note": f"step {step}",
            },
            step=step,
        )


def test_tensorboard_event_files_hold_each_scalar_once_per_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    accelerator = Accelerator(log_with="tensorboard", project_dir=str(tmp_path))
    accelerator.init_trackers("demo", config={"lr": 0.1, "layers": 2})
    where = tmp_path / "demo"
    assert f"nb_accel: tensorboard logs to event files in {where}" in capsys.readouterr().out
    _losses(accelerator)
    writer = accelerator.get_tracker("tensorboard", unwrap=True)
    accelerator.end_training()
    from torch.utils.tensorboard import SummaryWriter

    assert isinstance(writer, SummaryWriter)
    run = tmp_path / "demo"
    scalars = tracker_files.tensorboard_scalars(run)
    assert scalars["loss"] == [(s, pytest.approx(1.0 / (s + 1))) for s in range(4)]
    assert scalars["lr"] == [(s, pytest.approx(0.1)) for s in range(4)]
    # a dict is add_scalars: one folder per key, one chart
    assert tracker_files.tensorboard_scalars(run / "groups_train")["groups"] == [
        (s, float(s)) for s in range(4)
    ]
    assert tracker_files.tensorboard_scalars(run / "groups_eval")["groups"] == [
        (s, 2.0 * s) for s in range(4)
    ]
    texts = tracker_files.tensorboard_texts(run)
    assert texts["note/text_summary"] == [(s, f"step {s}") for s in range(4)]
    (hparams,) = run.glob("*/hparams.yml")
    assert "lr: 0.1" in hparams.read_text()


def test_logging_dir_of_project_configuration_is_where_tensorboard_writes(tmp_path: Path) -> None:
    config = ProjectConfiguration(project_dir=str(tmp_path / "p"), logging_dir=str(tmp_path / "l"))
    accelerator = Accelerator(log_with=LoggerType.TENSORBOARD, project_config=config)
    accelerator.init_trackers("run")
    accelerator.log({"x": 1.0}, step=3)
    accelerator.end_training()
    assert tracker_files.tensorboard_scalars(tmp_path / "l" / "run") == {"x": [(3, 1.0)]}
    assert not (tmp_path / "p").exists()


def test_mlflow_one_run_with_params_and_metric_history(
    mlflow_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = mlflow_uri
    accelerator = Accelerator(log_with=["mlflow"])
    accelerator.init_trackers(
        "experiment-a",
        config={"lr": 0.1, "batch_size": 8},
        init_kwargs={"mlflow": {"run_name": "first"}},
    )
    with pytest.warns(UserWarning, match="'note'"):
        _losses(accelerator)
    run = accelerator.get_tracker("mlflow", unwrap=True)
    accelerator.end_training()
    assert run.info.run_name == "first"
    assert (
        f"nb_accel: mlflow logs to run 'first' ({run.info.run_id}) of experiment 'experiment-a' "
        f"at {uri}"
    ) in capsys.readouterr().out
    (found,) = tracker_files.mlflow_runs(uri)
    assert found["experiment"] == "experiment-a"
    assert found["status"] == "FINISHED"
    assert found["params"] == {"lr": "0.1", "batch_size": "8"}
    assert found["metrics"]["loss"] == [(s, pytest.approx(1.0 / (s + 1))) for s in range(4)]
    assert found["metrics"]["groups/eval"] == [(s, 2.0 * s) for s in range(4)]
    assert "note" not in found["metrics"]


def test_wandb_offline_one_run_folder(
    offline_wandb: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    accelerator = Accelerator(log_with="wandb")
    accelerator.init_trackers(
        "proj", config={"lr": 0.1}, init_kwargs={"wandb": {"name": "named-run"}}
    )
    _losses(accelerator)
    run = accelerator.get_tracker("wandb", unwrap=True)
    assert run.name == "named-run"
    accelerator.end_training()
    (folder,) = offline_wandb.glob("offline-run-*")
    expected = f"nb_accel: wandb logs to run 'named-run' of project 'proj' (offline) in {folder}"
    assert expected in capsys.readouterr().out
    written = tracker_files.wandb_run(folder)
    assert written["project"] == "proj"
    assert written["config"]["lr"] == 0.1
    assert [row["_step"] for row in written["history"]] == [0, 1, 2, 3]
    assert [row["loss"] for row in written["history"]] == pytest.approx([1, 1 / 2, 1 / 3, 1 / 4])
    assert [row["groups.eval"] for row in written["history"]] == [0, 2, 4, 6]
    assert written["exit_code"] == 0


class Recording(GeneralTracker):
    """A tracker of one's own that notes every call."""

    name = "recording"
    requires_logging_directory = False

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, Any]] = []

    @property
    def tracker(self) -> list[tuple[str, Any]]:
        """The calls."""
        return self.calls

    def start(self) -> None:
        """Note it."""
        self.calls.append(("start", None))

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Note it."""
        self.calls.append(("config", values))

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Note it."""
        self.calls.append(("log", (values, step, kwargs)))

    def finish(self) -> None:
        """Note it."""
        self.calls.append(("finish", None))


def test_a_tracker_of_ones_own_gets_config_every_log_and_finish() -> None:
    mine = Recording()
    accelerator = Accelerator(log_with=[mine])
    accelerator.init_trackers("p", config={"a": 1})
    accelerator.log({"x": 1.0}, step=0)
    accelerator.log({"x": 2.0}, log_kwargs={"recording": {"commit": True}, "other": {"no": 1}})
    assert accelerator.trackers == [mine]
    assert accelerator.get_tracker("recording") is mine
    assert accelerator.get_tracker("recording", unwrap=True) is mine.calls
    accelerator.end_training()
    accelerator.end_training()  # finishes each run once
    assert accelerator.trackers == [mine]  # still listed, as with Accelerate
    assert mine.calls == [
        ("start", None),
        ("config", {"a": 1}),
        ("log", ({"x": 1.0}, 0, {})),
        ("log", ({"x": 2.0}, None, {"commit": True})),
        ("finish", None),
    ]


def test_registered_tracker_class_is_built_by_name_with_init_kwargs(tmp_path: Path) -> None:
    class Folder(Recording):
        name = "folder_tracker"
        requires_logging_directory = True

        def __init__(self, project: str, logging_dir: str, **options: Any) -> None:
            super().__init__()
            self.calls.append(("init", (project, logging_dir, options)))

    register_tracker_class(Folder)
    try:
        accelerator = Accelerator(log_with="folder_tracker", project_dir=str(tmp_path))
        accelerator.init_trackers("p", init_kwargs={"folder_tracker": {"k": 2}})
        (tracker,) = accelerator.trackers
        assert tracker.calls[:2] == [("init", ("p", str(tmp_path), {"k": 2})), ("start", None)]
        accelerator.end_training()
    finally:
        del LOGGER_TYPE_TO_CLASS["folder_tracker"]


def test_an_incomplete_tracker_class_is_refused() -> None:
    class NoName(GeneralTracker):
        requires_logging_directory = False

    with pytest.raises(NotImplementedError, match=r"`name`.*`tracker`"):
        NoName()


def test_a_missing_library_is_named_with_its_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", [p for p in sys.path if "site-packages" not in p])
    with pytest.raises(MissingTrackerLibraryError, match=r"pip install 'nb_accel\[wandb\]'"):
        Accelerator(log_with=["wandb"])


def test_a_library_that_is_not_installed_fails_before_training() -> None:
    if importlib.util.find_spec("aim") is not None:
        pytest.skip("aim is installed here")
    with pytest.raises(MissingTrackerLibraryError, match=r"nb_accel\[aim\]"):
        Accelerator(log_with="aim", project_dir=".")


def test_wrong_names_and_a_missing_folder_are_refused() -> None:
    with pytest.raises(ValueError, match="no tracker nb_accel knows"):
        Accelerator(log_with="tensorbored")
    with pytest.raises(ValueError, match="Logging with `tensorboard` requires a `logging_dir`"):
        Accelerator(log_with="tensorboard")


def test_all_is_every_installed_tracker_and_trackers_given(tmp_path: Path, mlflow_uri: str) -> None:
    mine = Recording()
    accelerator = Accelerator(log_with=["all", mine], project_dir=str(tmp_path))
    assert accelerator.log_with[0] is mine
    assert {"tensorboard", "mlflow", "wandb"} <= set(accelerator.log_with[1:])


def test_get_tracker_of_an_unknown_name_is_an_error(tmp_path: Path) -> None:
    accelerator = Accelerator(log_with=TensorBoardTracker("r", tmp_path))
    accelerator.init_trackers("ignored")
    with pytest.raises(ValueError, match="no such tracker"):
        accelerator.get_tracker("wandb")
    accelerator.end_training()
    assert tracker_files.tensorboard_scalars(tmp_path / "r") == {}


def test_log_without_trackers_still_works_outside_a_launch() -> None:
    accelerator = Accelerator()
    accelerator.init_trackers("nothing")
    accelerator.log({"loss": 1.0, "nested": {"a": torch.tensor(2.0)}}, step=0)
    assert accelerator.trackers == []
    accelerator.end_training()


def test_the_kernel_ends_only_runs_still_open_and_never_raises(
    mlflow_uri: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mlflow.tracking import MlflowClient

    from nb_accel._messages import TrackerRun
    from nb_accel.launch.launchers.left_open_runs import end_runs_left_open

    client = MlflowClient(tracking_uri=mlflow_uri)
    experiment = client.create_experiment("left-open")
    running = client.create_run(experiment).info.run_id
    finished = client.create_run(experiment).info.run_id
    client.set_terminated(finished, status="FINISHED")
    runs = [
        TrackerRun(0, "mlflow", running, mlflow_uri),
        TrackerRun(1, "mlflow", finished, mlflow_uri),
        TrackerRun(2, "no-such-tracker", "x", "nowhere"),
        TrackerRun(3, "mlflow", "0" * 32, mlflow_uri),  # not in the store
    ]
    assert end_runs_left_open(runs) == runs[:1]
    assert client.get_run(running).info.status == "KILLED"
    assert client.get_run(finished).info.status == "FINISHED"
    err = capsys.readouterr().err
    assert f"rank 0 was stopped before it ended its mlflow run {running}: ended as killed" in err
    assert f"could not end the mlflow run {'0' * 32} that rank 3 left open" in err
