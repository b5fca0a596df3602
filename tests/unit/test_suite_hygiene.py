"""A test run leaves nothing behind in the temporary folder, keeps the suite's private
configuration file set for its whole length, and runs on the CPU outside tests/gpu."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]

#: Run by a child pytest with the suite's conftest: where the configuration file is, and whether
#: its folder exists, seen from a test and from a process started by a test.
PROBE = """
import os, subprocess, sys
from pathlib import Path


def test_probe():
    file = os.environ["NB_ACCEL_CONFIG_FILE"]
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.environ['NB_ACCEL_CONFIG_FILE'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    cpu = os.environ.get("NB_ACCEL_USE_CPU")
    Path(os.environ["PROBE_OUT"]).write_text(
        f"{file}\\n{Path(file).parent.is_dir()}\\n{child}\\n{cpu}"
    )
"""


@pytest.mark.timeout(120)
def test_a_test_run_leaves_nothing_in_the_temporary_folder(tmp_path: Path) -> None:
    temp, out = tmp_path / "temp", tmp_path / "probe.txt"
    temp.mkdir()
    (tmp_path / "test_probe.py").write_text(PROBE)
    env = {
        **os.environ,
        "TMPDIR": str(temp),
        "PROBE_OUT": str(out),
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "conftest",
            "-p",
            "no:cacheprovider",
            f"--basetemp={tmp_path / 'base'}",
            str(tmp_path / "test_probe.py"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    file, existed, seen_by_child, cpu = out.read_text().splitlines()
    assert Path(file).parent.parent == temp and existed == "True"  # a private, existing folder
    assert seen_by_child == file  # processes started by tests see it too
    assert list(temp.iterdir()) == []  # and it is gone after the run
    assert cpu == "1"  # outside tests/gpu, launches run on the CPU even where GPUs are
