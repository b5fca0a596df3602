"""A rank brought down by another's failure, and a restart after one, as the notebook's saved
widget shows them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook
from widget_models import label_text

TYPO_ON_RANK_1 = """
import time
from pathlib import Path
import torch
import torch.distributed as dist
from nb_accel import notebook_launcher

def train(folder):
    rank, others = dist.get_rank(), [0, 2]
    if rank == 1:  # once the others have issued the all-reduce and wait in it
        deadline = time.monotonic() + 60
        while not all(Path(folder, f"rank{r}-in-all-reduce").exists() for r in others):
            assert time.monotonic() < deadline, "the others never reached the all-reduce"
            time.sleep(0.01)
        undefined_name
    work = dist.all_reduce(torch.ones(1), async_op=True)
    Path(folder, f"rank{rank}-in-all-reduce").touch()
    work.wait()

notebook_launcher(train, args=(FOLDER,), num_processes=3, cpu=True)
"""


def _widget_texts(notebook: Any, cell: Any) -> str:
    """Every label and HTML value of the widgets shown in ``cell`` (children included)."""
    models = notebook.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    pending = [
        output["data"]["application/vnd.jupyter.widget-view+json"]["model_id"]
        for output in cell.outputs
        if "application/vnd.jupyter.widget-view+json" in output.get("data", {})
    ]
    texts = []
    while pending:
        model = models[pending.pop()]
        state = model["state"]
        shown = label_text(model)
        texts.append(shown if shown is not None else str(state.get("value", "")))
        texts += [str(title) for title in state.get("titles", ())]
        pending += [child.removeprefix("IPY_MODEL_") for child in state.get("children", [])]
    return "\n".join(texts)


def test_the_widget_shows_the_cause_failed_and_the_others_stopped_by_it(tmp_path: Path) -> None:
    cell_source = TYPO_ON_RANK_1.replace("FOLDER", repr(str(tmp_path)))
    notebook = new_notebook(cells=[new_code_cell(cell_source)])
    NotebookClient(
        notebook, timeout=120, kernel_name="python3", allow_errors=True, store_widget_state=True
    ).execute()
    cell = notebook.cells[0]
    texts = _widget_texts(notebook, cell)
    assert "failed: NameError: name 'undefined_name' is not defined" in texts
    assert texts.count("stopped (rank 1 failed)") == 2  # ranks 0 and 2
    assert "· rank 1 failed" in texts  # the header names the cause's rank only
    assert "ranks 0, 1" not in texts and "ranks 1, 2" not in texts
    assert "Connection" not in texts and "GLHF" not in texts
    error = next(output for output in cell.outputs if output.output_type == "error")
    assert error.ename == "NameError"
    shown = "\n".join(error.traceback)
    assert "Ranks 0, 2 were stopped by this failure." in shown
    assert "Connection" not in shown and "GLHF" not in shown


KILLED_THEN_RESTARTED = """
import os, signal
import torch.distributed as dist
from nb_accel import notebook_launcher

def train():
    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    dist.barrier()
    if dist.get_rank() == 1 and attempt == "0":
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()
    return attempt

notebook_launcher(train, num_processes=2, cpu=True, max_restarts=2)
"""


def test_the_widget_shows_a_restart_and_its_cause() -> None:
    notebook = new_notebook(cells=[new_code_cell(KILLED_THEN_RESTARTED)])
    NotebookClient(
        notebook, timeout=120, kernel_name="python3", allow_errors=True, store_widget_state=True
    ).execute()
    cell = notebook.cells[0]
    assert not [output for output in cell.outputs if output.output_type == "error"]
    result = next(output for output in cell.outputs if output.output_type == "execute_result")
    assert result.data["text/plain"] == "['1', '1']"
    texts = _widget_texts(notebook, cell)
    assert "up to 2 restarts after a failure" in texts
    assert "restart 1 of 2 after rank 1 was killed by SIGKILL" in texts
    assert "done in" in texts and "failed" not in texts.replace("after a failure", "")
