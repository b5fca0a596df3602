"""``tools/at_once.py``, which runs ``make test``'s halves and the chaos campaign's shards at
once: every run's lines are shown after its name, each run has a temporary folder of its own,
and the exit code is the first failure's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

from at_once import run_at_once

pytestmark = pytest.mark.timeout(120)

PASSES = """
def test_passes(tmp_path):
    print("base", tmp_path.parent.name)
"""
FAILS = """
def test_fails():
    assert 1 == 2, "the failing run's own words"
"""


def _run(tmp_path: Path, files: dict[str, str]) -> list[str]:
    for name, text in files.items():
        (tmp_path / f"test_{name}.py").write_text(text)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    return [
        *("-p", "no:cacheprovider", "--noconftest", "-s", "-q"),
        *(f"--rootdir={tmp_path}", "-c", str(tmp_path / "pytest.ini")),
    ]


def test_both_runs_are_shown_and_the_failure_s_code_is_returned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    options = _run(tmp_path, {"passes": PASSES, "fails": FAILS})
    code = run_at_once(
        {
            "good": [*options, str(tmp_path / "test_passes.py")],
            "bad": [*options, str(tmp_path / "test_fails.py")],
        }
    )
    out = capsys.readouterr().out
    assert code == 1
    assert "[bad ] " in out and "the failing run's own words" in out, out
    assert "[good] base good" in out, out  # its own base folder, named after it
    assert out.splitlines()[-2:] == ["good: passed", "bad: failed (exit code 1)"], out


def test_runs_that_all_pass_return_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    options = _run(tmp_path, {"passes": PASSES})
    code = run_at_once({"one": [*options, str(tmp_path / "test_passes.py")]})
    assert code == 0
    assert capsys.readouterr().out.splitlines()[-1] == "one: passed"
