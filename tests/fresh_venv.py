"""Fresh virtual environments for the tests that install the package as a user would.

What a command run here starts carries a marker in its environment, so that a kernel or a worker
it leaves behind is found (even orphaned) and killed. pip runs with its own settings tuned to
fail fast on an unreachable index; pip's cache is shared with the user's, to keep reruns quick.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import psutil
import pytest

__all__ = [
    "CPU_INDEX",
    "PYPI",
    "environment",
    "pip_environment",
    "reachable",
    "run",
    "skip_or_fail_install",
]

#: PyTorch's index of CPU builds; PyPI's own torch for Linux is a CUDA build of several GB.
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PYPI = "https://pypi.org/simple/pip/"
#: Time given to a finished command's processes (a kernel, its workers) to end on their own.
SETTLE_S = 10.0
#: Name of the variable that marks every process a command starts, to find what it left behind.
MARKER = "NB_ACCEL_VENV_TEST_RUN"


def reachable(url: str) -> bool:
    """Whether an HTTP(S) server answers at url (any status counts as an answer)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=10):
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return False


def _marked(marker: str) -> list[psutil.Process]:
    """The processes whose environment carries this run's marker."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get(MARKER) == marker:
                found.append(process)
        except psutil.Error:
            continue
    return found


def _end_marked(marker: str) -> list[str]:
    """Kill what is still running with the marker after a grace period; describe what was."""
    deadline = time.monotonic() + SETTLE_S
    while _marked(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    leftover = _marked(marker)
    described = []
    for process in leftover:
        try:
            described.append(f"{process.pid} {process.name()}")
            process.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(leftover, timeout=5)
    return described


def run(command: list[str], env: dict[str, str], timeout: float, cwd: Path) -> tuple[int, str]:
    """Run command in cwd; return its exit status and combined output. Fail the test when it
    runs past timeout or leaves a process behind (which is killed)."""
    marker = uuid.uuid4().hex
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env={**env, MARKER: marker},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for child in _marked(marker):
            child.kill()
        output, _ = process.communicate()
        _end_marked(marker)
        pytest.fail(f"{' '.join(command[:4])} did not finish in {timeout} s:\n{output[-6000:]}")
    finally:
        if process.poll() is None:  # interrupted (pytest-timeout, Ctrl-C): stop it all
            for child in _marked(marker):
                child.kill()
            process.wait()
            _end_marked(marker)
    leftover = _end_marked(marker)
    assert not leftover, f"{' '.join(command[:4])} left processes running: {leftover}"
    return process.returncode, output


def environment(venv: Path) -> dict[str, str]:
    """This process's environment, switched to the virtual environment venv and its kernel."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CONDA_PREFIX")
    }
    jupyter_path = [str(venv / "share" / "jupyter"), env.get("JUPYTER_PATH", "")]
    env.update(
        VIRTUAL_ENV=str(venv),
        PATH=os.pathsep.join([str(venv / "bin"), env.get("PATH", "")]),
        PYTHONNOUSERSITE="1",
        # The kernel spec of this environment first, whatever the user's Jupyter folders hold.
        JUPYTER_PATH=os.pathsep.join(p for p in jupyter_path if p),
    )
    return env


def pip_environment(env: dict[str, str], constraints: Path | None) -> dict[str, str]:
    """pip's own settings: fail fast on an unreachable index instead of retrying it per package;
    ``constraints`` (a constraint file) when given."""
    pip_env = {
        **env,
        "PIP_RETRIES": "1",
        "PIP_TIMEOUT": "30",
        "PIP_DEFAULT_TIMEOUT": "30",
        "PIP_NO_INPUT": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    if constraints is not None:
        pip_env["PIP_CONSTRAINT"] = str(constraints)
    return pip_env


def skip_or_fail_install(output: str, what: str) -> None:
    """After pip failed to install ``what``: skip when the network keeps it out of reach (PyPI,
    or the CPU build of torch), else fail."""
    tail = output[-4000:]
    if not reachable(PYPI):
        pytest.skip(f"PyPI is unreachable; pip could not install {what}:\n{tail}")
    torch_missing = re.search(
        r"(No matching distribution found for|Cannot install) torch\b", output
    )
    if torch_missing and not reachable(CPU_INDEX + "/"):
        pytest.skip(
            f"the CPU build of torch is not available: {CPU_INDEX} is unreachable and pip found "
            f"no other copy of it (the CUDA build on PyPI is refused: several GB):\n{tail}"
        )
    pytest.fail(f"pip could not install {what}:\n{tail}")
