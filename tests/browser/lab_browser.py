"""Headless Chromium for the browser tests, and the JupyterLab actions they share.

Playwright drives Debian's Chromium (``/usr/bin/chromium``, or ``$NB_ACCEL_CHROMIUM``); it does
not download a browser of its own. Playwright is imported only when a browser is started, so
this module can be imported (and the tests skipped) without it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import pytest
from lab_server import isolated_env

if TYPE_CHECKING:
    from playwright.sync_api import FloatRect, Locator, Page

#: The shipped notebooks the servers serve copies of.
NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
#: The environment variable that turns the browser tests on.
ENABLE_VAR = "NB_ACCEL_BROWSER_TESTS"
#: The Chromium the tests drive.
CHROMIUM = Path(os.environ.get("NB_ACCEL_CHROMIUM", "/usr/bin/chromium"))
#: Headless, and quiet: no GPU, no QUIC, no first-run page, no background requests or updates.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: The browser window (CSS pixels): a laptop screen.
VIEWPORT_WIDTH, VIEWPORT_HEIGHT = 1400, 1000
#: Device pixels per CSS pixel, as on a high-density screen: screenshots (the documentation's
#: pictures among them) stay sharp when shown at their size in CSS pixels, or zoomed.
DEVICE_SCALE_FACTOR = 2
#: Longest wait for one browser action or for an element to appear (milliseconds).
ACTION_TIMEOUT_MS = 60_000
#: The tab of an open document, in JupyterLab's main area.
TAB = ".lm-DockPanel-tabBar .lm-TabBar-tab"


def skip_reason(front_end: str = "jupyterlab") -> str | None:
    """Why the browser tests of ``front_end`` (``"jupyterlab"``, or ``"notebook"``: the classic
    Notebook 6) cannot run here, or ``None`` when they can."""
    target = "make test-browser" if front_end == "jupyterlab" else "make test-classic"
    if os.environ.get(ENABLE_VAR) != "1":
        return f"browser tests run with {ENABLE_VAR}=1 ({target})"
    for module in (front_end, "playwright"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed ({target} installs it)"
    if front_end == "notebook" and not _classic_notebook():
        return "the classic Notebook 6 is not installed (make test-classic has it)"
    if not os.access(CHROMIUM, os.X_OK):
        return f"no Chromium at {CHROMIUM} (make test-browser installs Debian's chromium)"
    return None


def _classic_notebook() -> bool:
    """Whether the distribution ``notebook`` 6 is installed (its import name alone could be
    ``tests/notebook``, on the path of the tests)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("notebook").split(".")[0] == "6"
    except PackageNotFoundError:
        return False


@dataclass
class OpenNotebook:
    """A notebook open in JupyterLab: its file name, its panel, and the page."""

    name: str
    panel: Locator
    page: Page


def open_notebook(page: Page, name: str) -> OpenNotebook:
    """Open ``name`` from JupyterLab's file browser, as a user double-clicking it does."""
    page.locator(".jp-DirListing-item", has_text=name).dblclick()
    tab = page.locator(TAB, has_text=name)
    tab.wait_for()
    panel = page.locator(f"#{tab.get_attribute('data-id')}")
    panel.locator(".jp-Cell").first.wait_for()
    return OpenNotebook(name, panel, page)


def save_screenshot(target: Page | Locator, path: Path) -> None:
    """Save a PNG of the page's viewport, or of one element, at ``path``.

    The picture is written here rather than by Playwright, which would write it from a
    thread that then outlives the test.
    """
    path.write_bytes(target.screenshot())


def save_region(page: Page, parts: list[Locator], path: Path, margin: float = 8) -> None:
    """Save a PNG of the smallest part of the page's viewport that holds every visible element
    ``parts`` match, with ``margin`` CSS pixels around them."""
    boxes = [box for part in parts for element in part.all() if (box := element.bounding_box())]
    assert boxes, "no visible element to save"
    left = min(box["x"] for box in boxes) - margin
    top = min(box["y"] for box in boxes) - margin
    right = max(box["x"] + box["width"] for box in boxes) + margin
    bottom = max(box["y"] + box["height"] for box in boxes) + margin
    clip: FloatRect = {"x": left, "y": top, "width": right - left, "height": bottom - top}
    path.write_bytes(page.screenshot(clip=clip))


def dismiss_dialogs(page: Page) -> list[str]:
    """Close the open JupyterLab dialogs (as Escape does); the text of each one closed."""
    texts = []
    dialogs = page.locator(".jp-Dialog")
    for _attempt in range(5):
        if not dialogs.count():
            break
        texts.append(dialogs.first.inner_text())
        page.keyboard.press("Escape")
        page.wait_for_timeout(200)
    return texts


def close_notebook(notebook: OpenNotebook) -> None:
    """Close the notebook's tab without saving it (it is a copy in a temporary folder)."""
    page = notebook.page
    dismiss_dialogs(page)
    tab = page.locator(TAB, has_text=notebook.name)
    tab.locator(".lm-TabBar-tabCloseIcon").click()
    discard = page.locator(".jp-Dialog button", has_text="Discard")
    deadline = time.monotonic() + ACTION_TIMEOUT_MS / 1000
    while tab.count():
        if discard.count():  # "Save your work": the notebook has outputs now
            discard.click()
        elif time.monotonic() > deadline:
            raise TimeoutError(f"the tab of {notebook.name} did not close")
        page.wait_for_timeout(100)


def _descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _reap(pids: set[int]) -> None:
    processes = []
    for pid in pids:
        try:
            processes.append(psutil.Process(pid))
        except psutil.Error:
            continue
    _gone, alive = psutil.wait_procs(processes, timeout=10)
    for process in alive:
        try:
            process.kill()
        except psutil.Error:
            pass


@contextlib.contextmanager
def browser_page(url: str, ready: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Page]:
    """A headless Chromium page, with a fresh profile, showing ``url`` once ``ready`` (a CSS
    selector) is on it; the browser and every process of it gone afterwards."""
    from playwright.sync_api import sync_playwright

    before = _descendants()
    workdir = tmp_path_factory.mktemp("chromium")
    env: dict[str, str | float | bool] = {**isolated_env(workdir / "home")}
    playwright = sync_playwright().start()
    try:
        context = playwright.chromium.launch_persistent_context(
            str(workdir / "profile"),
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
            env=env,
            viewport={"width": VIEWPORT_WIDTH, "height": VIEWPORT_HEIGHT},
            device_scale_factor=DEVICE_SCALE_FACTOR,
        )
        try:
            context.set_default_timeout(ACTION_TIMEOUT_MS)
            tab = context.pages[0] if context.pages else context.new_page()
            tab.goto(url)
            tab.locator(ready).first.wait_for()
            yield tab
        finally:
            context.close()
    finally:
        playwright.stop()
        _reap(_descendants() - before)
