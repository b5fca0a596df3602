"""Fixtures for the browser tests: one JupyterLab server and one headless Chromium page for the
module, notebooks opened in that page per test, screenshots and logs under ``build/browser/``.

The tests run only with ``NB_ACCEL_BROWSER_TESTS=1`` (``make test-browser`` sets it), and are
skipped without JupyterLab, Playwright or Chromium. Nothing is left running: kernels are shut
down after each test, the server and the browser after the module, and any process of theirs
still there then is killed.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from lab_browser import (
    NOTEBOOKS,
    OpenNotebook,
    browser_page,
    close_notebook,
    open_notebook,
    save_screenshot,
    skip_reason,
)
from lab_server import LabServer, start_lab

if TYPE_CHECKING:
    from playwright.sync_api import Page

try:
    from playwright.sync_api import expect
except ImportError:  # the tests are skipped
    pass

ROOT = Path(__file__).resolve().parents[2]
#: Where screenshots and the server's log go (``build/`` is not tracked).
ARTIFACTS = ROOT / "build" / "browser"
FAILED = pytest.StashKey[bool]()


#: The test module of the classic Notebook 6 (Colab's front end's stack); the others are Lab's.
CLASSIC_TESTS = "test_classic_rendering.py"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip this folder's tests, before any fixture runs, when they cannot run here."""
    reasons = {front: skip_reason(front) for front in ("jupyterlab", "notebook")}
    here = Path(__file__).resolve().parent
    for item in items:
        if here in item.path.resolve().parents:
            reason = reasons["notebook" if item.path.name == CLASSIC_TESTS else "jupyterlab"]
            if reason is not None:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Note that a test failed, so that its fixture saves a screenshot of the page."""
    report = yield
    if report.failed:
        item.stash[FAILED] = True
    return report


@pytest.fixture(scope="session")
def artifacts() -> Path:
    """``build/browser/``, emptied of the previous run's screenshots and logs."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in [*ARTIFACTS.glob("*.png"), *ARTIFACTS.glob("*.log")]:
        old.unlink()
    return ARTIFACTS


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, artifacts: Path) -> Iterator[LabServer]:
    """A JupyterLab server on 127.0.0.1 serving copies of the shipped notebooks."""
    workdir = tmp_path_factory.mktemp("lab")
    server = start_lab(sorted(NOTEBOOKS.glob("*.ipynb")), workdir, artifacts / "jupyterlab.log")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def page(lab: LabServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Page]:
    """A headless Chromium page, with a fresh profile, showing JupyterLab."""
    with browser_page(lab.lab_url(), ".jp-DirListing-item", tmp_path_factory) as tab:
        yield tab


@pytest.fixture
def notebook(
    request: pytest.FixtureRequest, lab: LabServer, page: Page, artifacts: Path
) -> Generator[Callable[[str], OpenNotebook], None, None]:
    """Call it with a notebook's name to open that notebook. After the test the notebook is
    closed and its kernel shut down; after a failure the page is saved as a screenshot."""
    opened: list[OpenNotebook] = []

    def open_it(name: str) -> OpenNotebook:
        opened.append(open_notebook(page, name))
        lab.wait_for_idle_kernel(name)  # as a user waits for "Idle" before running cells
        indicator = opened[-1].panel.locator(".jp-Notebook-ExecutionIndicator")
        expect(indicator).to_have_attribute("data-status", "idle")
        return opened[-1]

    try:
        yield open_it
    finally:
        try:
            if request.node.stash.get(FAILED, False):
                save_screenshot(page, artifacts / f"{request.node.name}-failure.png")
            for item in opened:
                close_notebook(item)
        finally:
            lab.shutdown_kernels()
