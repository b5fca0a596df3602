"""Execute a notebook with a real Jupyter kernel and print what each cell showed.

Usage: python tools/run_notebook.py NOTEBOOK [--timeout SECONDS]
Exits non-zero when a cell raises.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError


def _show(cell: nbformat.NotebookNode, index: int) -> None:
    print(f"--- cell {index} ---")
    print(cell.source.strip())
    for output in cell.get("outputs", []):
        kind = output.get("output_type")
        if kind == "stream":
            sys.stdout.write(output.get("text", ""))
        elif kind in ("execute_result", "display_data"):
            data = output.get("data", {})
            if "application/vnd.jupyter.widget-view+json" in data:
                print(f"[widget] {data.get('text/plain', '')}".rstrip())
            elif "text/plain" in data:
                print(data["text/plain"])
        elif kind == "error":
            print("\n".join(output.get("traceback", [])))


def main() -> int:
    """Run the notebook given on the command line; return the process exit code."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    options = parser.parse_args()
    notebook = nbformat.read(options.notebook, as_version=4)
    client = NotebookClient(
        notebook,
        timeout=options.timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(options.notebook.parent.resolve())}},
    )
    status = 0
    try:
        client.execute()
    except CellExecutionError:
        status = 1
    code_cells = [c for c in notebook.cells if c.cell_type == "code"]
    for index, cell in enumerate(code_cells, start=1):
        _show(cell, index)
    print(f"=== {options.notebook.name}: {'failed' if status else 'ran'} ({len(code_cells)} cells)")
    return status


if __name__ == "__main__":
    sys.exit(main())
