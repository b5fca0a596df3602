"""The live launch view as a notebook user meets it: widgets saved in the executed notebook."""

from __future__ import annotations

import json
import re
from typing import Any

from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

TRAIN = """
import time
from nb_accel import Accelerator, notebook_launcher, tqdm

def train(fail_at=None):
    accelerator = Accelerator()
    for i in tqdm(range(50), desc="train", unit="batch"):
        time.sleep(0.004)
        accelerator.log({"loss": 1.0 / (i + 1), "rank": float(accelerator.process_index)}, step=i)
        if fail_at is not None and i == fail_at and accelerator.process_index == 1:
            raise ValueError("bad batch 20 on rank 1")
    return accelerator.process_index

results = notebook_launcher(train, num_processes=2)
"""
FAIL = "notebook_launcher(train, args=(20,), num_processes=2)"
SERIES = re.compile(r'<script type="application/json" class="nb-accel-series">(.*?)</script>', re.S)


def _models(notebook: Any) -> dict[str, Any]:
    state: dict[str, Any] = notebook.metadata["widgets"][
        "application/vnd.jupyter.widget-state+json"
    ]["state"]
    return state


def _under(models: dict[str, Any], cell: Any) -> list[dict[str, Any]]:
    """Every widget model shown in ``cell``'s outputs, children included."""
    roots = [
        o["data"]["application/vnd.jupyter.widget-view+json"]["model_id"]
        for o in cell.outputs
        if o.get("output_type") == "display_data"
        and "application/vnd.jupyter.widget-view+json" in o.get("data", {})
    ]
    found: list[dict[str, Any]] = []
    pending = list(roots)
    while pending:
        model = models[pending.pop()]
        found.append(model)
        children = model["state"].get("children", [])
        pending += [child.removeprefix("IPY_MODEL_") for child in children]
    return found


def _texts(models: list[dict[str, Any]]) -> str:
    return "\n".join(str(m["state"].get("value", "")) for m in models if "Label" in m["model_name"])


def test_the_widget_holds_every_rank_s_progress_and_the_logged_series() -> None:
    notebook = new_notebook(cells=[new_code_cell(TRAIN), new_code_cell(FAIL)])
    NotebookClient(
        notebook, timeout=120, kernel_name="python3", allow_errors=True, store_widget_state=True
    ).execute()
    models = _models(notebook)

    done = _under(models, notebook.cells[0])
    bars = [m["state"] for m in done if m["model_name"] == "FloatProgressModel"]
    assert len(bars) == 2  # a row per rank
    assert all((b["value"], b["max"], b["bar_style"]) == (50, 50, "success") for b in bars)
    assert "50/50" in _texts(done) and "batch/s" in _texts(done)
    charts = [m["state"]["value"] for m in done if SERIES.search(str(m["state"].get("value", "")))]
    assert len(charts) == 1
    series = json.loads(SERIES.search(charts[0]).group(1))  # type: ignore[union-attr]
    assert [x for x, _ in series["loss"]] == list(range(50))
    assert series["loss"][-1][1] == 1.0 / 50
    assert {y for _, y in series["rank"]} == {0.0}  # rank 0's metrics by default

    failed = _under(models, notebook.cells[1])
    bar_models = [m for m in failed if m["model_name"] == "FloatProgressModel"]
    styles = sorted(m["state"]["bar_style"] for m in bar_models)
    assert "danger" in styles
    assert "failed: ValueError: bad batch 20 on rank 1" in _texts(failed)
    error = next(o for o in notebook.cells[1].outputs if o.output_type == "error")
    assert error.ename == "ValueError"
