"""The virtual environment of a test lane that mirrors a notebook service's stack.

``python3 tools/lane_env.py LANE`` makes (or reuses) the lane's environment and prints its path.
Each lane installs its torch first, then the project with its extras under the service's pip
constraints (``../shared/stacks/``): every package the service has is installed at the service's
version or not at all, as ``pip install -c`` does on Colab and Kaggle themselves.

A lane's constraints are the service's file less the lines the lane's torch cannot take, plus the
lane's overrides (Kaggle's ipywidgets 8.1.5 over Colab's image). The torch builds a lane installs
come from the package index (a CPU build, or PyPI's CUDA 13 builds), not from the index Colab takes
its own from (CUDA 12.8): they bring their own CUDA packages and need a newer setuptools than
Colab's, so those lines go.

Environments are kept between runs on one machine, under ``$NB_ACCEL_LANES_DIR`` (default
``~/.cache/nb_accel/lanes``), named by a hash of what they are made from (the lane, its stack
file, ``pyproject.toml`` up to its tools' settings): a changed input makes a new one and
removes the lane's old ones. A kept environment gets this checkout installed again (editable)
when it was another's. Two calls for one lane at once take turns (a lock file beside the
environments): CI makes the lanes' environments while the suite runs, and each lane's own call
then waits for its environment.
"""

from __future__ import annotations

import argparse
import fcntl
import fnmatch
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STACKS = Path(os.environ.get("NB_ACCEL_STACKS", ROOT.parent / "shared" / "stacks"))
COLAB_GPU = "colab-gpu-2026-08-19.txt"
COLAB_TPU = "colab-tpu-2026-08-19.txt"
#: What every lane's tests need besides the package and the extras it tests.
TEST_DEPS = ("pytest>=8", "pytest-timeout>=2.2", "psutil>=5.9")
#: The stack's lines no lane keeps (shell patterns): what its torch build brings or needs.
TORCH_BUILD = ("setuptools", "cuda-*", "nvidia-*", "triton")


@dataclass(frozen=True)
class Lane:
    """One stack to test on: a Python, a torch, a service's constraints, the extras."""

    python: str
    torch: tuple[str, ...]
    stack: str
    extras: str
    drop: tuple[str, ...] = ()
    add: tuple[str, ...] = ()
    more: tuple[str, ...] = ()


LANES = {
    # Colab's GPU runtime as it is: Python 3.13, torch 2.11 (a CUDA build, run on the CPU) and
    # its notebook stack (IPython 7.34, ipywidgets 7.7.1, the classic Notebook 6.5.7, ...);
    # Playwright drives a browser on its Notebook (test-classic)
    "colab": Lane("3.13", ("torch==2.11.0",), COLAB_GPU, "test,examples", more=("playwright",)),
    # Kaggle: Colab's image with ipywidgets 8.1.5 (and its own front-end package) over it, on
    # this machine's fast torch (Colab's Python and torch are the colab lane's)
    "kaggle": Lane(
        "3.11",
        ("torch==2.13.0",),
        COLAB_GPU,
        "test,examples",
        drop=("ipywidgets", "widgetsnbextension"),
        add=("ipywidgets==8.1.5",),
    ),
    # Colab's TPU runtime: torch 2.9 with torch_xla 2.9 (its wheels exist for Python 3.13)
    "xla": Lane("3.13", ("torch==2.9.0", "torch_xla==2.9.0"), COLAB_TPU, "xla,mlflow,tensorboard"),
}


def _name(requirement: str) -> str:
    return re.split(r"[=<>!~\[ ;]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def constraints(lane: Lane) -> str:
    """The lane's pip constraints: the stack's lines less :data:`TORCH_BUILD` and ``drop``,
    plus ``add``."""
    dropped = [_name(pattern) for pattern in (*TORCH_BUILD, *lane.drop)]
    lines = (STACKS / lane.stack).read_text().splitlines()
    kept = [
        line
        for line in lines
        if line.strip() and not any(fnmatch.fnmatch(_name(line), p) for p in dropped)
    ]
    return "\n".join([*kept, *lane.add]) + "\n"


def find_python(version: str) -> str:
    """An interpreter of ``version`` ("3.13"): on the PATH, else one of pyenv's."""
    candidates = [shutil.which(f"python{version}") or ""]
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates += sorted(glob.glob(f"{pyenv}/versions/{version}.*/bin/python{version}"))
    for path in filter(None, candidates):
        done = subprocess.run([path, "--version"], capture_output=True, text=True, check=False)
        if done.returncode == 0 and done.stdout.split()[-1].startswith(f"{version}."):
            return path
    sys.exit(f"lane_env: no Python {version} found (on the PATH or in {pyenv}/versions)")


def _key(name: str, lane: Lane) -> str:
    digest = hashlib.sha256(repr((name, lane)).encode())
    digest.update((STACKS / lane.stack).read_bytes())
    project = (ROOT / "pyproject.toml").read_text()
    digest.update(project.split("\n[tool.", 1)[0].encode())  # what it installs, not its tools
    return digest.hexdigest()[:12]


def _pip(venv: Path, *args: str) -> None:
    command = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", *args]
    print("lane_env:", " ".join(command[3:]), file=sys.stderr, flush=True)
    done = subprocess.run(command, check=False, capture_output=True, text=True)
    # this machine's pip settings name local folders that may be missing: not worth a line each
    noise = "is ignored: it is neither a file nor a directory"
    print("".join(line for line in done.stderr.splitlines(True) if noise not in line), end="")
    if done.returncode != 0:
        sys.exit(f"lane_env: pip failed ({done.returncode})")


def make(name: str, lane: Lane, home: Path) -> Path:
    """The lane's environment, made when missing; this checkout installed in it (one call for
    the lane at a time: another waits for it)."""
    home.mkdir(parents=True, exist_ok=True)
    with open(home / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _make(name, lane, home)


def _make(name: str, lane: Lane, home: Path) -> Path:
    venv = home / f"{name}-{_key(name, lane)}"
    for old in home.glob(f"{name}-*"):
        if old != venv and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    done, root_file = venv / ".complete", venv / ".checkout"
    if not done.exists():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([find_python(lane.python), "-m", "venv", str(venv)], check=True)
        (venv / "constraints.txt").write_text(constraints(lane))
        _pip(venv, "install", "--quiet", *lane.torch)
        project = f"{ROOT}[{lane.extras}]"
        wanted = [*lane.torch, "-e", project, *TEST_DEPS, *lane.more]
        _pip(venv, "install", "--quiet", "-c", str(venv / "constraints.txt"), *wanted)
        root_file.write_text(str(ROOT))
        done.touch()
    elif root_file.read_text() != str(ROOT):
        _pip(venv, "install", "--quiet", "--no-deps", "-e", str(ROOT))
        root_file.write_text(str(ROOT))
    return venv


def main() -> None:
    """Make the lane's environment and print its path."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lane", choices=sorted(LANES))
    parser.add_argument("--constraints", action="store_true", help="print the constraints only")
    args = parser.parse_args()
    lane = LANES[args.lane]
    if args.constraints:
        print(constraints(lane), end="")
        return
    default = Path(os.path.expanduser("~/.cache/nb_accel/lanes"))
    home = Path(os.environ.get("NB_ACCEL_LANES_DIR", default))
    print(make(args.lane, lane, home))


if __name__ == "__main__":
    main()
