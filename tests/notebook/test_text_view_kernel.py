"""A front end that cannot draw widgets: ``NB_ACCEL_VIEW=text`` gives a notebook the text view,
rank 0's bar and the launch's lines as text in the cell, and no widget at all."""

from __future__ import annotations

from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

TEXT_VIEW = """
import os
os.environ["NB_ACCEL_VIEW"] = "text"
from nb_accel import Accelerator, notebook_launcher, tqdm

def train():
    accelerator = Accelerator()
    for step in tqdm(range(30), desc="steps"):
        accelerator.log({"loss": 1.0 / (step + 1)}, step=step)
    return accelerator.process_index

print("results", notebook_launcher(train, num_processes=2))
"""


def test_the_text_view_is_shown_in_a_notebook_when_asked_for() -> None:
    notebook = new_notebook(cells=[new_code_cell(TEXT_VIEW)])
    NotebookClient(notebook, timeout=120, kernel_name="python3").execute()
    outputs = notebook.cells[0].outputs
    widgets = [
        o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
    ]
    assert widgets == []  # nothing a front end without a widget manager cannot draw
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "Launching 2 processes on CPU" in text
    assert "steps: 100%" in text and "30/30" in text, text  # rank 0's bar, as text
    assert "results [0, 1]" in text
