"""The shipped notebooks, executed by a real kernel as a new user would run them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from widget_models import label_texts, shown_models

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
#: The series a launch view's chart draws, in the HTML of its widget.
SERIES = re.compile(r'<script type="application/json" class="nb-accel-series">(.*?)</script>', re.S)


@pytest.fixture(autouse=True)
def kernel_temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The notebooks' temporary folders (and the launches' scratch) go under ``tmp_path``."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))


def _run(name: str) -> nbformat.NotebookNode:
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    assert all(not cell.get("outputs") for cell in notebook.cells), f"{name} is saved with outputs"
    NotebookClient(notebook, timeout=300, kernel_name="python3", store_widget_state=True).execute()
    return notebook


def _output_text(output: nbformat.NotebookNode) -> str:
    """A stream's text, or a displayed object's plain-text form (a launch view's: its title)."""
    if output.get("output_type") == "stream":
        return str(output.get("text", ""))
    return str(output.get("data", {}).get("text/plain", "")) + "\n"


def _text(notebook: nbformat.NotebookNode) -> str:
    return "".join(
        _output_text(output) for cell in notebook.cells for output in cell.get("outputs", [])
    )


def test_quickstart_trains_a_digit_classifier_on_two_processes() -> None:
    notebook = _run("quickstart.ipynb")
    text = _text(notebook)
    assert "Launching 2 processes on CPU (gloo; fork)" in text  # the widget's title
    streams = "".join(o.get("text", "") for c in notebook.cells for o in c.get("outputs", []))
    assert "Launching" not in streams  # not printed again above the widget
    found = re.search(r"test accuracy: (\d\.\d+) on 297 digits", text)
    assert found and float(found.group(1)) >= 0.9, text
    assert "caught: rank 1 does not like this input" in text
    widgets = [
        o
        for c in notebook.cells
        for o in c.get("outputs", [])
        if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
    ]
    assert len(widgets) == 2  # one live view per launch


def test_cell_magic_notebook_keeps_state_across_cells() -> None:
    text = _text(_run("cell_magic.ipynb"))
    assert "rank 0 of 2 is ready" in text
    assert "caught: rank 1 found a bad batch | Raised on rank 1 of 2" in text
    assert "[rank 0] weights sum" in text and "[rank 1] weights sum" in text
    # a launched function on the same warm workers, twice, its resident model kept
    assert "same workers: True" in text and "the kept model trained on: True" in text


def test_config_widget_notebook_saves_the_defaults_a_launch_uses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NB_ACCEL_CONFIG_FILE", str(tmp_path / "config.yaml"))
    notebook = _run("config_widget.ipynb")
    text = _text(notebook)
    assert (
        "Saved to " in text
        and "Launching 2 processes on CPU (gloo; fork, bf16 mixed precision)" in text
    )
    launched = next(c for c in notebook.cells if "notebook_launcher(settings)" in c.source)
    assert launched.outputs[-1]["data"]["text/plain"] == "[(2, 'bf16'), (2, 'bf16')]"
    # the kernel's own setting is back at the end
    assert f"your defaults: {tmp_path / 'config.yaml'}" in text


def test_the_config_widget_tutorial_leaves_the_users_defaults_as_they_were(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run as a new user would (no NB_ACCEL_CONFIG_FILE): their saved file stays byte for
    byte, and the tutorial's own file is gone afterwards."""
    home = tmp_path / "config-home"
    saved = home / "nb_accel" / "default_config.yaml"
    saved.parent.mkdir(parents=True)
    saved.write_text("num_processes: 3\n")
    monkeypatch.delenv("NB_ACCEL_CONFIG_FILE")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    text = _text(_run("config_widget.ipynb"))
    assert "Saved to " in text and f"your defaults: {saved}" in text
    assert saved.read_text() == "num_processes: 3\n"
    assert sorted(p.name for p in home.rglob("*")) == ["default_config.yaml", "nb_accel"]
    assert not any(scratch.rglob("config.yaml"))


def test_checkpoint_resume_notebook_resumes_exactly() -> None:
    text = _text(_run("checkpoint_resume.ipynb"))
    assert "['checkpoint_0', 'checkpoint_1']" in text
    assert "resumed at step 10" in text
    assert "resumed run equals the uninterrupted one: True" in text


def test_migrating_notebook_runs_accelerate_style_code_with_the_import_swapped() -> None:
    text = _text(_run("migrating_from_accelerate.ipynb"))
    errors = [float(m) for m in re.findall(r"eval mse (\d+\.\d+) on 64 samples", text)]
    assert len(errors) == 6 and errors[-1] < errors[0] / 5  # it learns
    assert "loaded 385 parameters from ['model.safetensors']" in text


def test_trackers_notebook_writes_one_tensorboard_run_and_reads_it_back() -> None:
    notebook = _run("experiment_trackers.ipynb")
    text = _text(notebook)
    assert "steps per rank: [48, 48]" in text
    # where the run goes is a line of the launch view, not printed output
    assert "tensorboard --logdir" not in text
    state = notebook.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    shown = [str(m["state"].get("value", "")) for m in state.values()]
    assert any("tensorboard logs to event files in" in value for value in shown), shown
    # the main process's run only: its scalars, and the hyperparameters add_hparams files
    # in a folder of their own
    files = re.search(r"event files: \[(.*)\]", text)
    assert files and files.group(1).count("'regression") == 2, text
    found = re.search(r"(\d+) loss values, first (\d+\.\d+), last (\d+\.\d+)", text)
    assert found and int(found.group(1)) == 48, text
    assert float(found.group(3)) < float(found.group(2)) / 20  # it learns


def test_fsdp_notebook_trains_a_transformer_sharded_over_two_processes() -> None:
    notebook = _run("fsdp_transformer.ipynb")
    text = _text(notebook)
    assert "Launching 2 processes on CPU (gloo; fork, FSDP, 2 shards)" in text  # the view's title
    # each rank holds half of the model: its shard of every parameter, one unit per block + root
    held = re.findall(r"\[rank (\d)\] holds ([\d,]+) of the ([\d,]+) parameters \((\d+)%\)", text)
    assert sorted(rank for rank, *_ in held) == ["0", "1"], text
    for _, local, total, percent in held:
        assert 2 * int(local.replace(",", "")) == int(total.replace(",", "")) and percent == "50"
    assert text.count("parameters (50%), in 5 FSDP units") == 2, text
    assert "parameters held per rank: [104672, 104672] of 209344" in text
    # the live view: a row per rank with its finished epochs bar, and rank 0's loss chart
    launch = next(c for c in notebook.cells if "notebook_launcher(train" in c.source)
    shown = shown_models(notebook, launch)
    labels = label_texts(shown)
    assert "rank 0" in labels and "rank 1" in labels and labels.count("epochs") == 2, labels
    bars = [m["state"] for m in shown if m["model_name"] == "FloatProgressModel"]
    assert len(bars) == 2 and all(
        (float(b["value"]), float(b["max"]), b["bar_style"]) == (3.0, 3.0, "success") for b in bars
    ), bars
    charts = [SERIES.search(str(m["state"].get("value", ""))) for m in shown]
    series = [json.loads(found.group(1)) for found in charts if found]
    assert len(series) == 1 and [x for x, _ in series[0]["loss"]] == list(range(96))  # 3 x 32
    # the full weights, loaded into a plain model in the kernel, have learnt to count
    assert "saved: ['model.safetensors']" in text
    found = re.search(r"next-token accuracy: (\d\.\d+) on 512 new sequences", text)
    assert found and float(found.group(1)) >= 0.95, text
    assert "5 8 -> 11 14 17 20 23 26 29 32 35 38 41 44 47 50" in text
    assert "58 60 -> 62 0 2 4 6 8 10 12 14 16 18 20 22 24" in text
    # nothing on stderr: no warning from the workers or the kernel
    errors = [o for c in notebook.cells for o in c.get("outputs", []) if o.get("name") == "stderr"]
    assert not errors, errors
