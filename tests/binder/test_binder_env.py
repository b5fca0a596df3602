"""Binder's environment: a fresh virtual environment made from ``binder/`` runs the quick start.

Binder (repo2docker) installs ``binder/requirements.txt`` with pip, from the repository root, into
the environment of the notebook kernel. The slow test below does the same in a new virtual
environment and executes ``notebooks/quickstart.ipynb`` with that environment's Jupyter kernel, as
``tools/run_notebook.py`` does for ``make demo``.

Only pip's own behaviour is tuned from here (retries, timeouts): what gets installed comes from
``binder/``. On Linux a constraint file additionally insists on the CPU build of the pinned torch
release, so that a missing CPU index can never turn into a download of the CUDA build.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import time
from pathlib import Path

import pytest
from fresh_venv import CPU_INDEX, environment, pip_environment, run, skip_or_fail_install

ROOT = Path(__file__).resolve().parents[2]
BINDER = ROOT / "binder"
REQUIREMENTS = BINDER / "requirements.txt"
RUNTIME = BINDER / "runtime.txt"

VENV_TIMEOUT_S = 120
PIP_TIMEOUT_S = 480
CHECK_TIMEOUT_S = 120
NOTEBOOK_TIMEOUT_S = 300
NOTEBOOK_OPTIONS = ("--timeout", str(NOTEBOOK_TIMEOUT_S))

#: Printed by the fresh environment's Python: what was installed and which kernel a notebook gets.
CHECK_SCRIPT = """
import importlib.metadata as metadata, json, sys
import torch
import nb_accel
from jupyter_client.manager import KernelManager

print(json.dumps({
    "python": sys.executable,
    "torch": torch.__version__,
    "torch_cuda": torch.version.cuda,
    "nb_accel": nb_accel.__file__,
    "kernel": KernelManager(kernel_name="python3").format_kernel_cmd()[0],
    "nvidia": sorted(
        d.metadata["Name"] for d in metadata.distributions()
        if d.metadata["Name"].lower().startswith("nvidia")
    ),
}))
"""


def _requirement_lines() -> list[str]:
    """binder/requirements.txt without comments and blank lines."""
    lines = (line.split("#", 1)[0].strip() for line in REQUIREMENTS.read_text().splitlines())
    return [line for line in lines if line]


def _torch_pin() -> str:
    """The torch release binder/requirements.txt pins; fail unless it is one exact version."""
    torch_lines = [
        line for line in _requirement_lines() if re.match(r"torch\b(?![-_.\w])", line.lower())
    ]
    assert len(torch_lines) == 1, f"binder/requirements.txt names torch {len(torch_lines)} times"
    pin = re.fullmatch(r"torch\s*==\s*(\d+(?:\.\d+)+)", torch_lines[0])
    assert pin, (
        f"binder/requirements.txt must pin torch to one release (torch==X.Y.Z), not "
        f"{torch_lines[0]!r}: a range lets pip choose a newer CUDA build from PyPI"
    )
    return pin.group(1)


def _run(command: list[str], env: dict[str, str], timeout: float) -> tuple[int, str]:
    """Run command from the repository root (see :func:`fresh_venv.run`)."""
    return run(command, env, timeout, cwd=ROOT)


def test_binder_files_pin_cpu_torch_install_the_package_and_name_a_python() -> None:
    """binder/ asks for the CPU torch build, this package with its extras, and a Python."""
    lines = _requirement_lines()
    assert f"--extra-index-url {CPU_INDEX}" in lines, "binder/ must take torch from the CPU index"
    _torch_pin()
    assert any(re.fullmatch(r"(-e\s+)?\.(\[[\w,\s-]*examples[\w,\s-]*\])", x) for x in lines), (
        "binder/requirements.txt must install this package with its notebook extras"
    )
    runtime = re.fullmatch(r"python-3\.(\d+)", RUNTIME.read_text().strip())
    assert runtime, "binder/runtime.txt must name a Python as python-3.Y"
    pyproject = (ROOT / "pyproject.toml").read_text()
    minimum = re.search(r'requires-python\s*=\s*">=3\.(\d+)"', pyproject)
    assert minimum and int(runtime.group(1)) >= int(minimum.group(1)), "runtime.txt: Python too old"


@pytest.mark.fresh_env
@pytest.mark.timeout(VENV_TIMEOUT_S + PIP_TIMEOUT_S + CHECK_TIMEOUT_S + NOTEBOOK_TIMEOUT_S + 60)
def test_fresh_venv_from_binder_files_runs_the_quickstart_notebook() -> None:
    """pip installs binder/requirements.txt into a new venv whose kernel runs the quick start."""
    version = _torch_pin()
    with tempfile.TemporaryDirectory(prefix="nb_accel-binder-", ignore_cleanup_errors=True) as tmp:
        venv = Path(tmp) / "venv"
        env = environment(venv)
        status, output = _run([sys.executable, "-m", "venv", str(venv)], env, VENV_TIMEOUT_S)
        assert status == 0, output
        python = str(venv / "bin" / "python")

        constraints = None
        if sys.platform == "linux":  # elsewhere PyPI's torch is a CPU build already
            constraints = Path(tmp) / "cpu-torch.txt"
            constraints.write_text(f"torch=={version}+cpu\n")
        started = time.monotonic()
        status, output = _run(
            [python, "-m", "pip", "install", "-r", str(REQUIREMENTS.relative_to(ROOT))],
            pip_environment(env, constraints),
            PIP_TIMEOUT_S,
        )
        pip_s = time.monotonic() - started
        if status != 0:
            skip_or_fail_install(output, "binder/requirements.txt")

        status, output = _run([python, "-c", CHECK_SCRIPT], env, CHECK_TIMEOUT_S)
        assert status == 0, output
        installed = json.loads(output.strip().splitlines()[-1])
        assert installed["python"] == python and installed["kernel"] == python, installed
        expected = f"{version}+cpu" if constraints else version
        assert installed["torch"] == expected and installed["torch_cuda"] is None, installed
        assert not installed["nvidia"], f"CUDA packages installed: {installed['nvidia']}"
        assert Path(installed["nb_accel"]).resolve().is_relative_to(ROOT / "nb_accel"), installed

        started = time.monotonic()
        status, output = _run(
            [python, "tools/run_notebook.py", "notebooks/quickstart.ipynb", *NOTEBOOK_OPTIONS],
            env,
            NOTEBOOK_TIMEOUT_S + 30,
        )
        notebook_s = time.monotonic() - started
    assert status == 0, output
    assert "=== quickstart.ipynb: ran" in output, output
    assert "Launching 2 processes on CPU" in output, output
    found = re.search(r"test accuracy: (\d\.\d+) on (\d+) digits", output)
    assert found, output
    accuracy, digits = float(found.group(1)), int(found.group(2))
    assert digits == 297 and 0.9 <= accuracy <= 1.0, output
    print(f"pip install: {pip_s:.0f} s; notebook: {notebook_s:.0f} s; accuracy {accuracy:.3f}")
