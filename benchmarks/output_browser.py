"""The browser half of ``output.py``: how long JupyterLab takes to draw 10,000 printed lines.

JupyterLab (started as the browser tests start it, ``tests/browser/lab_server.py``) serves a
notebook with one cell per contender; headless Chromium (``tests/browser/lab_browser.py``)
opens it. Each cell is run with Ctrl+Enter in its editor and timed until its prompt has its
execution number and its output shows its last line(s); when some lines never come (Jupyter
server's IOPub rate limit drops messages beyond 1,000 a second, by default), until the output
last changed, and the table says how many lines were shown. A first round is not counted;
then rounds alternate the order. Re-running a cell replaces its output, so the page holds one
output per contender.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "browser"))

from lab_browser import (  # noqa: E402 - the browser tests' helpers
    ACTION_TIMEOUT_MS,
    CHROMIUM,
    CHROMIUM_ARGS,
    VIEWPORT_HEIGHT,
    VIEWPORT_WIDTH,
    open_notebook,
)
from lab_server import isolated_env, start_lab  # noqa: E402

if TYPE_CHECKING:
    from playwright.sync_api import Locator, Page

NOTEBOOK = "output_benchmark.ipynb"
#: Longest wait for one cell to be drawn (milliseconds).
CELL_TIMEOUT_MS = 100_000
#: How often the page is checked for the last line (milliseconds).
POLL_MS = 50

#: Whether the cell shows execution ``count``, its output's length, and which needles it holds.
STATE = """([cell, needles, count]) => {
    const out = cell.querySelector('.jp-OutputArea');
    const prompt = cell.querySelector('.jp-InputPrompt');
    const text = out ? out.textContent : '';
    return {
        done: !!prompt && prompt.textContent.includes(`[${count}]`),
        length: text.length,
        lines: (text.match(/\\n/g) || []).length,
        found: needles.every((needle) => text.includes(needle)),
    };
}"""
#: A finished cell whose output has not changed for this long is drawn (seconds).
SETTLED_S = 2.0


@dataclass
class Drawn:
    """How long a cell took to be drawn, and how many lines its output showed then."""

    seconds: float
    lines: int


def last_lines(name: str, lines: int, ranks: int) -> list[str]:
    """What the output of contender ``name`` ends with."""
    if "silent" in name:
        return []
    return [f"[rank {r}] line {lines // ranks - 1} of rank {r}" for r in range(ranks)]


def _write_notebook(folder: Path, setup: str, cells: dict[str, str]) -> Path:
    notebook = new_notebook(cells=[new_code_cell(setup), *map(new_code_cell, cells.values())])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    path = folder / NOTEBOOK
    nbformat.write(notebook, path)
    return path


def missing() -> str | None:
    """What the browser lane lacks here (``make test-browser`` installs it), or ``None``."""
    for module in ("jupyterlab", "playwright"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed"
    if not os.access(CHROMIUM, os.X_OK):
        return f"no Chromium at {CHROMIUM}"
    return None


def _run_and_time(page: Page, cell: Locator, needles: list[str], count: int) -> Drawn:
    """Run ``cell`` (Ctrl+Enter in its editor), the kernel's ``count``-th execution, and time
    it until its output holds all ``needles`` (or, when some never come, until the finished
    cell's output last changed)."""
    cell.locator(".jp-InputArea-editor").click()
    handle = cell.element_handle()
    start = time.perf_counter()
    page.keyboard.press("Control+Enter")
    deadline = start + CELL_TIMEOUT_MS / 1000
    length, changed = -1, start
    while time.perf_counter() < deadline:
        state = page.evaluate(STATE, [handle, needles, count])
        now = time.perf_counter()
        if state["done"] and state["found"]:
            return Drawn(now - start, state["lines"])
        if state["length"] != length:
            length, changed = state["length"], now
        elif state["done"] and now - changed >= SETTLED_S:
            return Drawn(changed - start, state["lines"])
        page.wait_for_timeout(POLL_MS)
    raise TimeoutError(f"cell {count} was not drawn in {CELL_TIMEOUT_MS / 1000:.0f} s")


def _measure(
    page: Page, panel: Locator, cells: dict[str, str], rounds: int, lines: int, ranks: int
) -> dict[str, list[Drawn]]:
    """Run the setup cell, then every cell once a round (a first round not counted)."""
    code_cells = panel.locator(".jp-CodeCell")
    count = 1
    _run_and_time(page, code_cells.nth(0), [], count)
    drawn: dict[str, list[Drawn]] = {name: [] for name in cells}
    order = list(enumerate(cells, 1))
    for index in range(rounds + 1):
        for position, name in order if index % 2 == 0 else order[::-1]:
            count += 1
            needles = last_lines(name, lines, ranks)
            result = _run_and_time(page, code_cells.nth(position), needles, count)
            if index > 0:
                drawn[name].append(result)
    return drawn


def browser_times(
    cells: dict[str, str], setup: str, rounds: int, lines: int, ranks: int
) -> dict[str, list[Drawn]]:
    """Each cell's draw in each of ``rounds`` rounds, in a JupyterLab started for it."""
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="nb_accel-output-bench-") as folder:
        work = Path(folder)
        lab = start_lab([_write_notebook(work, setup, cells)], work / "lab", work / "lab.log")
        playwright = sync_playwright().start()
        try:
            context = playwright.chromium.launch_persistent_context(
                str(work / "profile"),
                executable_path=str(CHROMIUM),
                headless=True,
                args=CHROMIUM_ARGS,
                env={**isolated_env(work / "chromium-home")},
                viewport={"width": VIEWPORT_WIDTH, "height": VIEWPORT_HEIGHT},
            )
            context.set_default_timeout(ACTION_TIMEOUT_MS)
            page = context.pages[0] if context.pages else context.new_page()
            page.goto(lab.lab_url())
            page.locator(".jp-DirListing-item").first.wait_for()
            try:
                panel = open_notebook(page, NOTEBOOK).panel
                lab.wait_for_idle_kernel(NOTEBOOK)
                return _measure(page, panel, cells, rounds, lines, ranks)
            finally:
                context.close()
        finally:
            playwright.stop()
            lab.stop()


def print_browser_table(
    cells: dict[str, str], setup: str, rounds: int, lines: int, ranks: int
) -> None:
    """Time the cells in JupyterLab and print the table (or why it cannot run here)."""
    reason = missing()
    if reason is not None:
        print(f"\nJupyterLab draw time: not measured ({reason}; make test-browser installs it)")
        return
    drawn = browser_times(cells, setup, rounds, lines, ranks)
    print(
        f"\nJupyterLab draw time, headless Chromium: Ctrl+Enter until the last line is shown "
        f"(or the output stops changing); median of {rounds} rounds after 1, alternating"
    )
    print(f"  {'cell':<28} {'median s':>9} {'max s':>7} {'vs baseline':>12} {'lines shown':>12}")
    baseline = statistics.median(d.seconds for d in next(iter(drawn.values())))
    for name, values in drawn.items():
        median = statistics.median(d.seconds for d in values)
        shown_lines = min(d.lines for d in values)
        print(
            f"  {name:<28} {median:>9.2f} {max(d.seconds for d in values):>7.2f} "
            f"{median / baseline:>11.1f}x {shown_lines:>12,}"
        )
