"""The code base passes its linters: ruff (style, bugs) and mypy (complete, consistent types)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

#: ``make lint`` runs these (``make test`` leaves them out: a minute of mypy).
pytestmark = pytest.mark.lint

ROOT = Path(__file__).resolve().parents[2]


#: How long mypy may take: a first run (no cache, as in CI's fresh clone) on two cores shared
#: with CI's lanes in the background took more than 110 s.
MYPY_S = 400


def _run(*command: str, timeout: float = 110) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *command],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_ruff_finds_nothing() -> None:
    done = _run("ruff", "check", "nb_accel", "tests", "benchmarks", "tools")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.timeout(MYPY_S + 20)
def test_mypy_finds_nothing() -> None:
    # one cache per environment: a lane's libraries (other versions) crash another's cache
    environment = hashlib.sha256(sys.prefix.encode()).hexdigest()[:12]
    done = _run("mypy", "--cache-dir", f".mypy_cache/{environment}", "nb_accel", timeout=MYPY_S)
    assert done.returncode == 0, done.stdout + done.stderr
