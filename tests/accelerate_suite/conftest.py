"""Accelerate's own tests, run on Accelerate and on nb_accel (an opt-in lane).

The lane runs only with ``NB_ACCEL_ACCELERATE_SUITE=1`` (``make test-accelerate`` sets it and
installs the Accelerate release the suite is written for). At collection it lists the test
calls each of Accelerate's multi-process scripts makes, by running the script on Accelerate
with every test call held back, and the tests of its unit-test files, downloaded from its
source distribution. Everything it writes lives in one folder made for the run and removed at
its end.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from suite_runs import Baseline, UnitResult, collect_unit_tests, run_on_accelerate
from suite_sources import (
    SCRIPTS,
    check_installed_version,
    download_unit_tests,
    installed_script,
    rewrite,
)

ENABLED = os.environ.get("NB_ACCEL_ACCELERATE_SUITE") == "1"

if not ENABLED:
    collect_ignore_glob = ["test_*.py"]


@dataclass
class Suite:
    """The run's folder, the nb_accel twins of the test files, and what collection found."""

    folder: Path
    twins: dict[str, Path] = field(default_factory=dict)
    originals: dict[str, Path] = field(default_factory=dict)
    calls: dict[str, Baseline] = field(default_factory=dict)
    unit_ids: dict[str, list[str]] = field(default_factory=dict)
    unit_results: dict[tuple[str, str], dict[str, UnitResult]] = field(default_factory=dict)


SUITE = pytest.StashKey[Suite]()


def _prepare(folder: Path) -> Suite:
    suite = Suite(folder)
    for side in ("accelerate", "nb_accel"):
        (folder / side).mkdir()
    for name in SCRIPTS:
        original = installed_script(name)
        suite.originals[name] = original
        suite.twins[name] = folder / "nb_accel" / original.name
        suite.twins[name].write_text(rewrite(original.read_text()))
        suite.calls[name] = run_on_accelerate(original, -1, folder)
    for name, path in download_unit_tests(folder / "accelerate").items():
        suite.originals[name] = path
        suite.twins[name] = folder / "nb_accel" / path.name
        suite.twins[name].write_text(rewrite(path.read_text()))
        suite.unit_ids[name] = collect_unit_tests(path)
    return suite


def pytest_configure(config: pytest.Config) -> None:
    """Take Accelerate's tests into a folder of the run's own, and list what they hold."""
    if not ENABLED:
        return
    problem = check_installed_version()
    if problem:
        raise pytest.UsageError(f"the Accelerate suite cannot run: {problem}")
    folder = Path(tempfile.mkdtemp(prefix="nb_accel-accelerate-suite-"))
    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
    config.stash[SUITE] = _prepare(folder)


@pytest.fixture(scope="session")
def suite(request: pytest.FixtureRequest) -> Suite:
    """The run's test files and what collection found in them."""
    return request.config.stash[SUITE]
