"""The notebooks in the classic Notebook 6.5.7 with ipywidgets 7.7.1 (Colab's notebook stack), in
a real (headless) browser: the live view and the config form are drawn as ipywidgets 7 draws
them, with their colours and weights (ipywidgets 7 has no style traits for them: classes and a
stylesheet do it), and the hover text of a failed rank's note.

Run by ``make test-classic`` in the Colab-mirror lane's environment; screenshots go to
``build/browser/`` (``classic-*.png``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from lab_browser import NOTEBOOKS, browser_page, save_screenshot
from lab_server import CLASSIC, START_TIMEOUT_S, LabServer, start_lab

try:
    from playwright.sync_api import Locator, Page, expect
except ImportError:  # the tests are skipped (see conftest.py)
    pass

pytestmark = pytest.mark.timeout(300)

#: Longest wait for all of a notebook's cells to run (seconds).
RUN_TIMEOUT_S = 240.0
#: Longest wait for a widget to be drawn (milliseconds).
WIDGET_TIMEOUT_MS = 30_000
RED, GREEN = "rgb(211, 47, 47)", "rgb(46, 125, 50)"
#: Text that means a widget was not drawn: still loading, failed, or shown as its repr.
NOT_A_WIDGET = ("Loading widget", "Error displaying widget", "VBox(children", "Label(value")
#: The page's kernel is connected and has answered its ``kernel_info`` request (the page's own
#: sign that the kernel is ready; the server's record of the kernel's state is not waited for:
#: it follows the kernel's status messages, and once in a while stayed at "starting").
KERNEL_READY = """() => {
    const kernel = window.Jupyter && Jupyter.notebook && Jupyter.notebook.kernel;
    return Boolean(kernel && kernel.is_connected() && kernel.info_reply.protocol_version);
}"""


@pytest.fixture(scope="module")
def classic(tmp_path_factory: pytest.TempPathFactory, artifacts: Path) -> Iterator[LabServer]:
    """A classic Notebook 6 server on 127.0.0.1 serving copies of the shipped notebooks."""
    workdir = tmp_path_factory.mktemp("classic")
    notebooks = sorted(NOTEBOOKS.glob("*.ipynb"))
    server = start_lab(notebooks, workdir, artifacts / "classic.log", app=CLASSIC)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def tree(classic: LabServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Page]:
    """A headless Chromium page showing the classic Notebook's file list."""
    url = f"{classic.url}/tree?token={classic.token}"
    with browser_page(url, "#notebook_list .item_link", tmp_path_factory) as tab:
        yield tab


@pytest.fixture
def kernels_shut(classic: LabServer, tree: Page) -> Iterator[None]:
    """The test's kernels (and their workers) shut down after it, its page back at the list."""
    try:
        yield
    finally:
        classic.shutdown_kernels()
        tree.goto(f"{classic.url}/tree?token={classic.token}")


def run_notebook(classic: LabServer, page: Page, name: str, last_output: str) -> None:
    """Open ``name`` and run every cell (Cell > Run All), then wait for ``last_output`` and for
    every cell to be done."""
    page.goto(f"{classic.url}/notebooks/{name}?token={classic.token}")
    page.wait_for_function(KERNEL_READY, timeout=START_TIMEOUT_S * 1000)
    page.locator("#celllink").click()
    page.locator("#run_all_cells").click()
    done = page.locator(".output_area", has_text=last_output)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not done.count():
        if time.monotonic() > deadline:
            pytest.fail(f"{name} did not show {last_output!r} in {RUN_TIMEOUT_S} s")
        page.wait_for_timeout(250)
    busy = page.locator(".input_prompt", has_text="[*]")
    expect(busy).to_have_count(0, timeout=int(RUN_TIMEOUT_S * 1000))


def cell_output(page: Page, source: str) -> Locator:
    """The widget output of the code cell whose source contains ``source``."""
    cell = page.locator(".cell.code_cell").filter(has=page.locator(".input_area", has_text=source))
    expect(cell).to_have_count(1)
    view = cell.locator(".output_subarea").filter(has=page.locator(".jupyter-widgets"))
    expect(view).to_have_count(1, timeout=WIDGET_TIMEOUT_MS)
    return view


def assert_drawn(page: Page) -> None:
    """No output shows a widget as loading, broken or as its text repr."""
    texts = "\n".join(page.locator(".output_area").all_inner_texts())
    for sign in NOT_A_WIDGET:
        assert sign not in texts, f"the page shows {sign!r}:\n{texts}"


def test_the_live_view_is_drawn_with_its_colours(
    classic: LabServer, tree: Page, artifacts: Path, kernels_shut: None
) -> None:
    run_notebook(classic, tree, "quickstart.ipynb", "caught: rank 1 does not like this input")
    view = cell_output(tree, "results = notebook_launcher(train")
    bars = view.locator(".widget-hprogress")
    expect(bars).to_have_count(2, timeout=WIDGET_TIMEOUT_MS)
    for rank in range(2):
        expect(bars.nth(rank).locator(".progress-bar-success")).to_have_count(1)
        label = view.locator(".widget-html", has_text=re.compile(f"^rank {rank}$"))
        expect(label).to_have_css("font-weight", "700")  # the bold class, from the stylesheet
    expect(view.locator("svg.nb-accel-chart")).to_be_visible()
    failing = cell_output(tree, "notebook_launcher(fails")
    note = failing.locator(".widget-html", has_text="failed: ValueError")
    expect(note).to_have_css("color", RED)
    title = note.locator("span[title]").get_attribute("title") or ""
    assert "rank 1 does not like this input" in title  # the hover text of the failure
    expect(failing.locator(".progress-bar-danger")).to_have_count(1)
    assert_drawn(tree)
    save_screenshot(view, artifacts / "classic-quickstart-progress.png")
    save_screenshot(failing, artifacts / "classic-quickstart-failure-view.png")


def test_the_config_form_is_drawn_and_says_saved_in_green(
    classic: LabServer, tree: Page, artifacts: Path, kernels_shut: None
) -> None:
    run_notebook(classic, tree, "config_widget.ipynb", "[(2, 'bf16'), (2, 'bf16')]")
    form = cell_output(tree, "form = ConfigWidget(path=tutorial_config)")
    expect(form.locator(".widget-dropdown select").first).to_be_visible()
    expect(form).to_contain_text("This machine:")
    processes = form.locator("label.widget-label", has_text=re.compile("^Processes$"))
    assert (processes.get_attribute("title") or "").startswith("num_processes: ")
    expect(form.locator(".widget-html-content", has_text="Saved to")).to_have_css("color", GREEN)
    for name in ("Save", "Load", "Reset"):
        expect(form.locator("button.jupyter-button", has_text=name)).to_be_visible()
    assert_drawn(tree)
    save_screenshot(form, artifacts / "classic-config_widget-form.png")
