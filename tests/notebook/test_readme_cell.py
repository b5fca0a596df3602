"""The README's first-launch cell, run as a newcomer runs it: pasted into a notebook cell of a
real Jupyter kernel. It trains on 2 processes, shows the live view and prints both losses."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

README = Path(__file__).resolve().parents[2] / "README.md"
#: The markers around the cell (the site's home page includes the same lines).
CELL = re.compile(
    r"<!-- --8<-- \[start:first-launch\] -->\n```python\n(.*?)```\n"
    r"<!-- --8<-- \[end:first-launch\] -->",
    re.S,
)


@pytest.fixture(autouse=True)
def kernel_temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The launch's scratch goes under ``tmp_path``."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))


@pytest.mark.timeout(300)
def test_the_readme_s_first_launch_runs_in_a_notebook_cell() -> None:
    found = CELL.search(README.read_text())
    assert found, "README.md has no first-launch cell between its markers"
    source = found.group(1)
    assert "..." not in source  # complete: nothing left for the reader to fill in
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    NotebookClient(notebook, timeout=240, kernel_name="python3").execute()
    outputs = notebook.cells[0].outputs
    assert not [o for o in outputs if o.get("output_type") == "error"], outputs
    view = "application/vnd.jupyter.widget-view+json"
    widgets = [o for o in outputs if view in o.get("data", {})]
    assert len(widgets) == 1  # the live view
    printed = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    losses = ast.literal_eval(printed.strip().splitlines()[-1])
    assert len(losses) == 2 and all(loss < 0.05 for loss in losses), printed
