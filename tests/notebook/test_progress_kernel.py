"""The live launch view as a notebook user meets it: widgets saved in the executed notebook."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from kernel_driver import CELL_TIMEOUT_S, running_kernel, start_cell
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook
from widget_models import label_texts, state_text

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
    return "\n".join(label_texts(models))


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


STUCK = """
import os, time
from pathlib import Path
import psutil
os.environ["NB_ACCEL_STALL_AFTER_S"] = "1"
from nb_accel import Accelerator, notebook_launcher, tqdm

def running(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False

def stuck(folder):
    accelerator = Accelerator()
    where, deadline = Path(folder), time.monotonic() + 60
    bar = tqdm(total=100, desc="train")
    if accelerator.process_index == 0:
        (where / "rank0.tmp").write_text(str(os.getpid()))
        os.replace(where / "rank0.tmp", where / "rank0")  # never seen half written
        bar.update(100)
        bar.close()
        return 0
    while not (where / "rank0").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    rank0 = int((where / "rank0").read_text())
    while running(rank0):
        time.sleep(0.02)  # rank 0 has returned and exited
    bar.update(2)
    bar.refresh()
    while not (where / "seen").exists() and time.monotonic() < deadline:
        bar.refresh()  # redrawn with the same count, as tqdm's monitor thread does
        time.sleep(0.05)
    bar.update(98)
    bar.close()
    return 1

print("results", notebook_launcher(stuck, ({folder!r},), num_processes=2))
"""


class WidgetStates:
    """The widget models of a kernel, kept up to date from its iopub messages."""

    def __init__(self) -> None:
        self.models: dict[str, dict[str, Any]] = {}

    def take(self, message: dict[str, Any]) -> None:
        """Apply a comm_open or an update."""
        content = message["content"]
        if message["msg_type"] == "comm_open":
            self.models[content["comm_id"]] = dict(content["data"].get("state", {}))
        elif message["msg_type"] == "comm_msg" and content["data"].get("method") == "update":
            self.models.setdefault(content["comm_id"], {}).update(content["data"]["state"])

    def rank_row(self, rank: int) -> list[dict[str, Any]] | None:
        """The models of the line that shows ``rank``: label, desc, pct, bar, text, note."""
        for state in self.models.values():
            ids = [c.removeprefix("IPY_MODEL_") for c in state.get("children", [])]
            if len(ids) == 6 and state_text(self.models.get(ids[0], {})) == f"rank {rank}":
                return [self.models.get(i, {}) for i in ids]
        return None


def test_the_stuck_rank_is_flagged_and_the_finished_one_stays_green(tmp_path: Path) -> None:
    states = WidgetStates()
    notes: dict[int, set[str]] = {0: set(), 1: set()}
    with running_kernel() as (_, client):
        msg_id = start_cell(client, STUCK.format(folder=str(tmp_path)))
        stdout = ""
        while True:
            message = client.get_iopub_msg(timeout=CELL_TIMEOUT_S)
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            states.take(message)
            content = message["content"]
            if message["msg_type"] == "stream":
                stdout += content["text"]
            if message["msg_type"] == "status" and content["execution_state"] == "idle":
                break
            for rank in (0, 1):
                row = states.rank_row(rank)
                if row is not None:
                    notes[rank].add(state_text(row[5]) or "")
            if any(note.startswith("stalled for") for note in notes[1]):
                (tmp_path / "seen").touch()
    assert "results [0, 1]" in stdout
    assert (tmp_path / "seen").exists(), notes
    assert not any("stalled" in note for note in notes[0]), notes[0]
    final = [states.rank_row(rank) for rank in (0, 1)]
    assert all(row is not None and row[3].get("bar_style") == "success" for row in final)
