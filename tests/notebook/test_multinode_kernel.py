"""A multi-node launch as a notebook user meets it: node 1 is a Jupyter kernel, node 0 a
separate process on the same machine; the kernel's cell shows its ranks (2 and 3) live and
returns their results."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook
from ports import free_port
from widget_models import label_texts, shown_models

NODE_SCRIPT = Path(__file__).parents[1] / "multiproc" / "multinode_node.py"

CELL = """
import time
from nb_accel import Accelerator, notebook_launcher, tqdm

def train():
    accelerator = Accelerator()
    for i in tqdm(range(20), desc="train"):
        time.sleep(0.01)
        accelerator.log({"loss": 1.0 / (i + 1)}, step=i)
    print("rank", accelerator.process_index, "of", accelerator.num_processes)
    return accelerator.process_index

results = notebook_launcher(train, num_processes=2, num_nodes=2, node_rank=1,
                            rdzv_endpoint="127.0.0.1:{port}", rdzv_timeout=60)
print("results", results)
"""


@pytest.mark.timeout(240)
def test_node_1_in_a_kernel_shows_and_returns_ranks_2_and_3(tmp_path: Path) -> None:
    port = free_port()
    endpoint, out = f"127.0.0.1:{port}", str(tmp_path / "node0.json")
    node0 = subprocess.Popen(
        [sys.executable, str(NODE_SCRIPT), "0", endpoint, "ok", out, "num_nodes=2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        notebook = new_notebook(cells=[new_code_cell(CELL.replace("{port}", str(port)))])
        NotebookClient(
            notebook, timeout=150, kernel_name="python3", store_widget_state=True
        ).execute()
    finally:
        try:
            node0.wait(timeout=60)
        finally:
            node0.kill()
            node0.wait()
    cell = notebook.cells[0]
    text = "".join(  # streams, and the launch view's plain-text form (its title)
        o.get("text", "") or o.get("data", {}).get("text/plain", "") + "\n" for o in cell.outputs
    )
    assert "node 1 of 2 (ranks 2-3 of 4)" in text
    assert "results [2, 3]" in text
    assert "rank 2 of 4" in text and "rank 3 of 4" in text
    widgets = shown_models(notebook, cell)
    labels = label_texts(widgets)
    assert "rank 2" in labels and "rank 3" in labels
    bars = [m["state"] for m in widgets if m["model_name"] == "FloatProgressModel"]
    assert sorted((b["value"], b["max"], b["bar_style"]) for b in bars) == [
        (20, 20, "success"),
        (20, 20, "success"),
    ]
