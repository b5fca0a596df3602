"""The config form as a notebook user meets it: set values, Save, then launch without options."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

FORM = """
import os
os.environ["NB_ACCEL_CONFIG_FILE"] = {path!r}
from nb_accel import ConfigWidget
form = ConfigWidget()
form
"""
SET_AND_SAVE = """
form.controls["num_processes"].value = 2
form.controls["mixed_precision"].value = "bf16"
form.controls["gradient_accumulation_steps"].value = 3
form.save_button.click()
print(form.message.value)
"""
LAUNCH = """
from nb_accel import Accelerator, notebook_launcher

def seen():
    acc = Accelerator()
    return acc.num_processes, acc.mixed_precision, acc.gradient_accumulation_steps

print("workers saw", notebook_launcher(seen))
"""


def test_saved_form_values_become_the_launch_defaults(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    notebook = new_notebook(
        cells=[
            new_code_cell(FORM.format(path=str(path))),
            new_code_cell(SET_AND_SAVE),
            new_code_cell(LAUNCH),
        ]
    )
    NotebookClient(notebook, timeout=120, kernel_name="python3", store_widget_state=True).execute()
    shown = notebook.cells[0].outputs
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in shown)
    saved = "".join(o.get("text", "") for o in notebook.cells[1].outputs)
    assert "Saved to" in saved and str(path) in saved
    assert "mixed_precision: bf16" in path.read_text()
    launched = "".join(  # streams, and the launch view's plain-text form (its title)
        o.get("text", "") or o.get("data", {}).get("text/plain", "") + "\n"
        for o in notebook.cells[2].outputs
    )
    assert "Launching 2 processes on CPU (gloo; fork, bf16 mixed precision)" in launched
    assert "workers saw [(2, 'bf16', 3), (2, 'bf16', 3)]" in launched


EMBEDDED = """
import os
import ipywidgets
os.environ["NB_ACCEL_CONFIG_FILE"] = {path!r}
from nb_accel import ConfigWidget
form = ConfigWidget()
ipywidgets.VBox([ipywidgets.HTML("<b>Launch settings</b>"), form])
"""
SAVE_THEN_EDIT = """
form.save_button.click()
print(form.message.value)
form.controls["timeout"].value = 600.0
print(form.message.value)
"""


def _descendants(models: dict[str, Any], model_id: str) -> list[dict[str, Any]]:
    found, pending = [], [model_id]
    while pending:
        model = models[pending.pop()]
        found.append(model)
        pending += [c.removeprefix("IPY_MODEL_") for c in model["state"].get("children", [])]
    return found


def test_the_form_is_a_widget_in_a_layout_with_labels_in_words(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    notebook = new_notebook(
        cells=[new_code_cell(EMBEDDED.format(path=str(path))), new_code_cell(SAVE_THEN_EDIT)]
    )
    NotebookClient(notebook, timeout=120, kernel_name="python3", store_widget_state=True).execute()
    models = notebook.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    (shown,) = [
        o["data"]["application/vnd.jupyter.widget-view+json"]["model_id"]
        for o in notebook.cells[0].outputs
        if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
    ]
    outer = models[shown]["state"]["children"]
    assert len(outer) == 2
    form = _descendants(models, outer[1].removeprefix("IPY_MODEL_"))
    assert form[0]["model_name"] == "VBoxModel"  # the form itself, holding its controls
    # the hover text the front end gets: ``tooltip`` (ipywidgets 8), ``description_tooltip`` (7)
    tips = {m["state"].get("description"): m["state"].get("tooltip") for m in form}
    sevens = {m["state"].get("description"): m["state"].get("description_tooltip") for m in form}
    labels = {name: tips[name] or sevens[name] or "" for name in tips}
    assert labels["Processes"].startswith("num_processes: ")
    assert labels["Mixed precision"].startswith("mixed_precision: ")
    assert labels["Timeout (s)"].startswith("timeout: ")
    assert not any(name and "_" in name for name in labels), labels
    printed = "".join(o.get("text", "") for o in notebook.cells[1].outputs).splitlines()
    assert printed == [f"Saved to {path}", "Changed; not saved yet"]
    messages = [m["state"].get("value") for m in form if m["model_name"] == "HTMLModel"]
    assert "Changed; not saved yet" in messages and f"Saved to {path}" not in messages


PICK_FSDP = """
form.controls["num_processes"].value = 2
form.controls["sharding"].value = "fsdp2"
print("picked", form.controls["sharding"].label)
form.save_button.click()
print(form.message.value)
"""
LAUNCH_SHARDED = """
import os
from nb_accel import notebook_launcher

def told() -> str:
    return os.environ["ACCELERATE_USE_FSDP"]

print("workers saw", notebook_launcher(told))
print("asked for DDP", notebook_launcher(told, fsdp=False))
"""


def test_fsdp_picked_in_the_form_shards_the_next_launch(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    notebook = new_notebook(
        cells=[
            new_code_cell(FORM.format(path=str(path))),
            new_code_cell(PICK_FSDP),
            new_code_cell(LAUNCH_SHARDED),
        ]
    )
    NotebookClient(notebook, timeout=120, kernel_name="python3", store_widget_state=True).execute()
    models = notebook.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    dropdowns = {m["state"].get("description"): m["state"] for m in models.values()}
    assert dropdowns["Sharding"]["_options_labels"] == ["DDP", "FSDP2"]
    picked = "".join(o.get("text", "") for o in notebook.cells[1].outputs)
    assert "picked FSDP2" in picked and "Saved to" in picked
    assert "sharding: fsdp2" in path.read_text()
    launched = "".join(  # streams, and each launch view's plain-text form (its title)
        o.get("text", "") or o.get("data", {}).get("text/plain", "") + "\n"
        for o in notebook.cells[2].outputs
    )
    assert "Launching 2 processes on CPU (gloo; fork, FSDP, 2 shards)" in launched
    assert "workers saw ['true', 'true']" in launched
    assert "Launching 2 processes on CPU (gloo; fork)" in launched  # fsdp=False wins
    assert "asked for DDP ['false', 'false']" in launched
