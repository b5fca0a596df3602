"""The code base passes its linters: ruff (style, bugs) and mypy (complete, consistent types)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *command],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )


def test_ruff_finds_nothing() -> None:
    done = _run("ruff", "check", "nb_accel", "tests", "benchmarks", "tools")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_finds_nothing() -> None:
    done = _run("mypy", "nb_accel")
    assert done.returncode == 0, done.stdout + done.stderr
