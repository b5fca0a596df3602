"""trackio, SwanLab, Comet, ClearML, DVCLive and Aim in a 2-process launch, each offline with its
files in ``tmp_path``: one run (the main process's) holding every step. Each test runs where
its library is installed (``pip install nb_accel[<name>]``) and is skipped elsewhere, except under
``NB_ACCEL_TRACKERS_LANE=1`` (``make test-trackers``, which installs all six), where a missing
library fails the test."""

from __future__ import annotations

import importlib.util
import json
import os
import sqlite3
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from nb_accel import Accelerator, notebook_launcher

STEPS = 3


def train_and_log(name: str, folder: str, init_kwargs: dict[str, Any]) -> list[str]:
    """Log ``STEPS`` losses (rank r logs step + 10 r) to the tracker ``name``."""
    accelerator = Accelerator(log_with=name, project_dir=folder)
    accelerator.init_trackers("demo", config={"lr": 0.1}, init_kwargs={name: init_kwargs})
    for step in range(STEPS):
        loss = torch.tensor(float(step + 10 * accelerator.process_index))
        accelerator.log({"loss": loss}, step=step)
    names = [tracker.name for tracker in accelerator.trackers]
    accelerator.end_training()
    return names


def _needs(module: str) -> None:
    """Skip unless ``module`` is installed (not imported here: some read their folders from the
    environment when imported, and the workers must do that after the test set it); under
    ``NB_ACCEL_TRACKERS_LANE=1`` a missing ``module`` fails the test instead."""
    if importlib.util.find_spec(module) is None:
        if os.environ.get("NB_ACCEL_TRACKERS_LANE") == "1":
            pytest.fail(f"{module} is not installed, and the trackers lane needs it")
        pytest.skip(f"{module} is not installed")


def _launch(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **init: Any) -> None:
    monkeypatch.chdir(tmp_path)  # libraries that write next to the code write here
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    names = notebook_launcher(
        train_and_log, args=(name, str(tmp_path / "project"), init), num_processes=2
    )
    assert names == [[name], []]


@pytest.mark.timeout(240)
def test_trackio(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _needs("trackio")
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    _launch("trackio", tmp_path, monkeypatch)
    with sqlite3.connect(tmp_path / "trackio" / "demo.db") as db:
        rows = db.execute("select run_id, step, metrics from metrics order by id").fetchall()
    assert len({run for run, _, _ in rows}) == 1
    assert [(step, json.loads(metrics)["loss"]) for _, step, metrics in rows] == [
        (s, float(s)) for s in range(STEPS)
    ]


@pytest.mark.timeout(240)
def test_swanlab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _needs("swanlab")
    monkeypatch.setenv("SWANLAB_ROOT", str(tmp_path / "swanlab_root"))
    _launch("swanlab", tmp_path, monkeypatch, mode="local", log_dir=str(tmp_path / "swanlog"))
    (run,) = (tmp_path / "swanlog").glob("run-*")
    summaries = [json.loads(p.read_text()) for p in run.glob("logs/*/_summary.json")]
    assert [(s["num"], s["min"], s["max"]) for s in summaries] == [(STEPS, 0.0, STEPS - 1.0)]


@pytest.mark.timeout(240)
def test_comet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _needs("comet_ml")
    monkeypatch.setenv("COMET_OFFLINE_DIRECTORY", str(tmp_path / "comet"))
    _launch("comet_ml", tmp_path, monkeypatch, online=False)
    (archive,) = (tmp_path / "comet").glob("*.zip")
    with zipfile.ZipFile(archive) as files:
        lines = files.read("messages.json").decode().splitlines()
    metrics = [
        json.loads(line)["payload"]["metric"]
        for line in lines
        if '"metric"' in line and '"loss"' in line
    ]
    assert [(m["step"], float(m["metricValue"])) for m in metrics] == [
        (s, float(s)) for s in range(STEPS)
    ]


@pytest.mark.timeout(240)
def test_clearml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _needs("clearml")
    monkeypatch.setenv("CLEARML_OFFLINE_MODE", "1")
    monkeypatch.setenv("CLEARML_CACHE_DIR", str(tmp_path / "clearml"))
    _launch("clearml", tmp_path, monkeypatch)
    (session,) = [p for p in (tmp_path / "clearml" / "offline").iterdir() if p.is_dir()]
    events = [
        event
        for line in (session / "metrics.jsonl").read_text().splitlines()
        for event in json.loads(line)
        if event.get("metric") == "loss"
    ]
    assert [(e["iter"], e["value"]) for e in events] == [(s, float(s)) for s in range(STEPS)]


@pytest.mark.timeout(240)
def test_dvclive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _needs("dvclive")
    _launch("dvclive", tmp_path, monkeypatch, dir=str(tmp_path / "dvclive"), save_dvc_exp=False)
    table = (tmp_path / "dvclive" / "plots" / "metrics" / "loss.tsv").read_text().splitlines()
    assert table == ["step\tloss", *(f"{s}\t{float(s)}" for s in range(STEPS))]
    assert "lr: 0.1" in (tmp_path / "dvclive" / "params.yaml").read_text()


@pytest.mark.timeout(240)
def test_aim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _needs("aim")
    _launch("aim", tmp_path, monkeypatch)
    # read in a process of its own: Aim's index manager leaves a thread behind
    found = subprocess.run(
        [sys.executable, "-c", _READ_AIM, str(tmp_path / "project")],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert json.loads(found.stdout.splitlines()[-1]) == {
        "runs": 1,
        "name": "demo",
        "hparams": {"lr": 0.1},
        "loss": [float(s) for s in range(STEPS)],
    }


#: Aim's own reader: index the repository's run (what `aim up` does first), print it as JSON.
_READ_AIM = """
import json, sys
import aim
from aim.sdk.index_manager import RepoIndexManager

repo = aim.Repo(sys.argv[1])
for run_hash in repo.list_all_runs():
    RepoIndexManager.get_index_manager(repo).index(run_hash)
runs = list(repo.iter_runs())
run = runs[0]
(loss,) = [m for m in run.metrics() if m.name == "loss"]
print(json.dumps({"runs": len(runs), "name": run.name, "hparams": run["hparams"],
                  "loss": loss.values.values_list()}))
"""
