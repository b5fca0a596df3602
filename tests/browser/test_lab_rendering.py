"""The shipped notebooks run in JupyterLab in a real (headless) browser, as a user runs them.

Each test opens a notebook from JupyterLab's file browser, runs every cell from the Run menu,
waits for the last output, and checks what the page shows: the launch view and the config form
must be drawn by ipywidgets (bars, labels, inputs, the metric chart), never left at "Loading
widget..." nor shown as their text repr ("VBox(children=...)"), and ``%%distributed`` cells
must show their ranks' output. Screenshots are saved under ``build/browser/``; ``make
screenshots`` copies those the documentation shows to ``docs/images/``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from lab_browser import OpenNotebook, dismiss_dialogs, save_region, save_screenshot

from nb_accel.notebook.config_widget import LABELS

try:
    from playwright.sync_api import Locator, Page, expect
except ImportError:  # the tests are skipped (see conftest.py)
    pass

pytestmark = pytest.mark.timeout(300)

#: Longest wait for all of a notebook's cells to run (milliseconds).
RUN_TIMEOUT_MS = 240_000
#: Longest wait for a widget to be drawn, or to follow a change (milliseconds).
WIDGET_TIMEOUT_MS = 30_000
#: Text that means a widget was not drawn: still loading, failed, or shown as its repr.
NOT_A_WIDGET = (
    "Loading widget",
    "Error displaying widget",
    "HBox(children",
    "VBox(children",
    "FloatProgress(",
    "Label(value",
    "ConfigWidget object at",
)
#: tqdm's text for a finished bar: ``8/8 [00:01<00:00,  5.33it/s]`` (tqdm pads the rate to five
#: characters; the page may show the padding as one space).
FINISHED_EPOCHS = re.compile(r"8/8 \[\d\d:\d\d<00:00, +\d+\.\d\d(?:it/s|s/it)\]")
GREEN = "rgb(46, 125, 50)"

OpenFn = Callable[[str], OpenNotebook]


def run_all_cells(notebook: OpenNotebook, last_output: str) -> None:
    """Run > Run All Cells, then wait for ``last_output`` and for every cell to be done."""
    page = notebook.page
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.locator('li[data-command="runmenu:run-all"]').click()
    done = notebook.panel.locator(".jp-OutputArea-output", has_text=last_output)
    deadline = time.monotonic() + RUN_TIMEOUT_MS / 1000
    while not done.count():
        dialogs = dismiss_dialogs(page)
        if dialogs:
            pytest.fail(f"JupyterLab asked while {notebook.name} ran: {dialogs}")
        if time.monotonic() > deadline:
            pytest.fail(f"{notebook.name} did not show {last_output!r} in {RUN_TIMEOUT_MS} ms")
        page.wait_for_timeout(250)
    prompts = notebook.panel.locator(".jp-InputPrompt", has_text="[*]")
    expect(prompts).to_have_count(0, timeout=RUN_TIMEOUT_MS)
    indicator = notebook.panel.locator(".jp-Notebook-ExecutionIndicator")
    expect(indicator).to_have_attribute("data-status", "idle", timeout=RUN_TIMEOUT_MS)


def code_cell(notebook: OpenNotebook, source: str) -> Locator:
    """The code cell whose source contains ``source``."""
    inputs = notebook.page.locator(".jp-InputArea", has_text=source)
    cell = notebook.panel.locator(".jp-CodeCell").filter(has=inputs)
    expect(cell).to_have_count(1)
    return cell


def widget_output(cell: Locator) -> Locator:
    """The output of ``cell`` that holds a widget view (drawn or not)."""
    outputs = cell.locator(".jp-OutputArea-output")
    found = outputs.filter(has=cell.page.locator(".jupyter-widgets"))
    expect(found).to_have_count(1, timeout=WIDGET_TIMEOUT_MS)
    return found


def assert_no_widget_fallbacks(notebook: OpenNotebook) -> None:
    """No output of the notebook shows a widget as loading, broken, or as its text repr."""
    texts = "\n".join(notebook.panel.locator(".jp-OutputArea").all_inner_texts())
    for sign in NOT_A_WIDGET:
        assert sign not in texts, f"{notebook.name} shows {sign!r}:\n{texts}"
    assert "Traceback" not in texts, texts


def fill_fraction(bar: Locator) -> float:
    """How much of a progress widget's track its bar covers, as drawn (0 to 1)."""
    fraction: float = bar.locator(".progress-bar").evaluate(
        "e => e.getBoundingClientRect().width / e.parentElement.getBoundingClientRect().width"
    )
    return fraction


def assert_launch_view(view: Locator, status: str, styles: list[str]) -> None:
    """The launch view is drawn: its ``status`` header and one bar per rank, in ``styles``."""
    bars = view.locator(".widget-hprogress")
    expect(bars).to_have_count(len(styles), timeout=WIDGET_TIMEOUT_MS)
    expect(view.locator(".nb-accel-status")).to_contain_text(status)
    for rank, style in enumerate(styles):
        label = view.locator(".widget-label", has_text=re.compile(f"^rank {rank}$"))
        expect(label).to_be_visible()
        bar = bars.nth(rank)
        if style:
            expect(bar.locator(f".progress-bar-{style}")).to_have_count(1)
        else:  # the default style: neither green nor red
            expect(bar.locator(".progress-bar")).not_to_have_class(re.compile("success|danger"))
        box = bar.locator(".progress").bounding_box()
        assert box is not None and box.get("width", 0) > 100, f"rank {rank}'s bar is {box}"


def test_quickstart_shows_the_live_view_as_widgets(
    notebook: OpenFn, page: Page, artifacts: Path
) -> None:
    """The quick start trains on 2 processes; both launches show the launch view as widgets:
    green bars with tqdm's text and the loss chart, then a red rank and a stopped one."""
    quickstart = notebook("quickstart.ipynb")
    run_all_cells(quickstart, "caught: rank 1 does not like this input")

    training = code_cell(quickstart, "results = notebook_launcher(train")
    accuracy = re.search(r"test accuracy: (\d\.\d+) on 297 digits", training.inner_text())
    assert accuracy and float(accuracy.group(1)) >= 0.9, training.inner_text()
    view = widget_output(training)
    assert_launch_view(view, "done in", ["success", "success"])
    for rank in range(2):
        assert fill_fraction(view.locator(".widget-hprogress").nth(rank)) > 0.99
    meters = FINISHED_EPOCHS.findall(view.inner_text())
    assert len(meters) == 2, view.inner_text()  # tqdm's final text, average rate included
    chart = view.locator("svg.nb-accel-chart")
    expect(chart).to_have_count(1)
    expect(chart).to_be_visible()
    points = chart.locator("polyline").get_attribute("points") or ""
    assert len(points.split()) >= 100, points  # one point per logged step, 188 steps
    expect(view.locator(".nb-accel-panel")).to_contain_text("loss")
    box = chart.bounding_box()
    assert box is not None and box["width"] >= 300 and box["height"] >= 150, box

    failing = widget_output(code_cell(quickstart, "notebook_launcher(fails"))
    assert_launch_view(failing, "rank 1 failed", ["", "danger"])
    expect(failing).to_contain_text("failed: ValueError: rank 1 does not like this input")
    expect(failing).to_contain_text("stopped")
    assert_no_widget_fallbacks(quickstart)

    save_screenshot(view, artifacts / "quickstart-progress.png")
    save_screenshot(failing, artifacts / "quickstart-failure-view.png")
    training.evaluate("cell => cell.scrollIntoView({block: 'start'})")
    save_screenshot(page, artifacts / "quickstart.png")


def _control(form: Locator, name: str) -> Locator:
    """The control of the field ``name`` in ``form``, found by its label."""
    text = LABELS[name]
    label = form.page.locator("label.widget-label", has_text=re.compile(f"^{re.escape(text)}$"))
    found = form.locator(".widget-inline-hbox").filter(has=label)
    expect(found).to_have_count(1)
    return found


def _selected(form: Locator, name: str) -> str:
    """The text of the option selected in the dropdown ``name`` of ``form``."""
    text: str = (
        _control(form, name).locator("select").evaluate("s => s.options[s.selectedIndex].text")
    )
    return text


def test_config_form_renders_and_talks_to_the_kernel(
    notebook: OpenFn, page: Page, artifacts: Path
) -> None:
    """The config form is drawn as widgets, shows what the notebook's cells saved, and answers
    edits made in the browser (multi-node fields, Save disabled, Reset)."""
    config = notebook("config_widget.ipynb")
    run_all_cells(config, "[(2, 'bf16'), (2, 'bf16')]")

    form = widget_output(code_cell(config, "form = ConfigWidget(path=tutorial_config)"))
    expect(form.locator(".widget-dropdown select").first).to_be_visible(timeout=WIDGET_TIMEOUT_MS)
    expect(form).to_contain_text("This machine:")
    for name in ("Save", "Load", "Reset"):
        expect(form.locator("button.jupyter-button", has_text=name)).to_be_visible()
    for name in ("num_processes", "mixed_precision", "start_method", "timeout", "num_nodes"):
        expect(_control(form, name)).to_be_visible()
    cpu = form.locator(".widget-checkbox", has_text="cpu").locator("input[type=checkbox]")
    expect(cpu).to_be_checked()
    expect(cpu).to_be_disabled()  # no GPU here: cpu is fixed
    expect(_control(form, "node_rank")).to_be_hidden()  # a multi-node field, one node here
    # The cells set the values and pressed Save in the kernel; the browser follows.
    assert _selected(form, "num_processes") == "2"
    assert _selected(form, "mixed_precision") == "bf16"
    message = form.locator(".widget-html-content", has_text="Saved to")
    expect(message).to_be_visible()
    expect(message).to_have_css("color", GREEN)
    printed = code_cell(config, "form.save_button.click()").locator(".jp-OutputArea")
    expect(printed).to_contain_text("Saved to")
    assert "<span" not in printed.inner_text(), printed.inner_text()
    launch = widget_output(code_cell(config, "notebook_launcher(settings)"))
    assert_launch_view(launch, "done in", ["success", "success"])
    assert_no_widget_fallbacks(config)
    save_screenshot(form, artifacts / "config_widget-form.png")
    save_screenshot(launch, artifacts / "config_widget-launch.png")
    form.evaluate("output => output.scrollIntoView({block: 'start'})")
    save_screenshot(page, artifacts / "config_widget.png")
    # its fields and buttons, without the lines that name this test's temporary files
    fields = [form.locator(".widget-inline-hbox:not(.widget-html)"), form.locator("button")]
    save_region(page, fields, artifacts / "config_widget-fields.png")

    # Edits in the browser reach the kernel, whose answer comes back to the page.
    num_nodes = _control(form, "num_nodes").locator("input")
    num_nodes.fill("2")
    num_nodes.press("Enter")
    for name in ("node_rank", "rdzv_endpoint", "rdzv_backend", "rdzv_timeout"):
        expect(_control(form, name)).to_be_visible(timeout=WIDGET_TIMEOUT_MS)
    save = form.locator("button.jupyter-button", has_text="Save")
    expect(form).to_contain_text("must be 'host:port' when num_nodes > 1")  # next to its field
    expect(save).to_be_disabled()
    save_screenshot(form, artifacts / "config_widget-multi-node.png")
    num_nodes.fill("1")
    num_nodes.press("Enter")
    expect(_control(form, "node_rank")).to_be_hidden(timeout=WIDGET_TIMEOUT_MS)
    expect(save).to_be_enabled()
    form.locator("button.jupyter-button", has_text="Reset").click()
    expect(form).to_contain_text("Built-in defaults (not saved yet)", timeout=WIDGET_TIMEOUT_MS)
    assert _selected(form, "num_processes") == "auto"
    assert _selected(form, "mixed_precision") == "no"
    assert_no_widget_fallbacks(config)


def test_cell_magic_shows_each_cells_output(notebook: OpenFn, page: Page, artifacts: Path) -> None:
    """``%%distributed`` cells run on a pool of 2 ranks: rank 0's output by default, every
    rank's, prefixed, with ``--all-ranks``; the caught error and the pool's status as text."""
    magic = notebook("cell_magic.ipynb")
    run_all_cells(magic, "caught: rank 1 found a bad batch | Raised on rank 1 of 2")

    first = code_cell(magic, "%%distributed -n 2")
    expect(first.locator(".jp-OutputArea")).to_contain_text("for %%distributed")
    expect(first.locator(".jp-OutputArea")).to_contain_text("rank 0 of 2 is ready")
    everyone = code_cell(magic, "%%distributed --all-ranks")
    for rank in range(2):
        expect(everyone.locator(".jp-OutputArea")).to_contain_text(f"[rank {rank}] weights sum")
    status = code_cell(magic, "%distributed status").locator(".jp-OutputArea")
    expect(status).to_contain_text("alive")
    assert_no_widget_fallbacks(magic)

    save_screenshot(first, artifacts / "cell_magic-start.png")
    save_screenshot(everyone, artifacts / "cell_magic-all-ranks.png")
    first.evaluate("cell => cell.scrollIntoView({block: 'start'})")
    save_screenshot(page, artifacts / "cell_magic.png")
