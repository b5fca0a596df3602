"""The wheel a user would install, built from a copy of the sources (so that the build leaves
nothing in the working tree), and what it holds."""

from __future__ import annotations

import os
import shutil
import sys
import zipfile
from email.message import Message
from email.parser import Parser
from pathlib import Path

from fresh_venv import pip_environment, run, skip_or_fail_install

ROOT = Path(__file__).resolve().parents[2]
#: What the build reads: the project's metadata, its long description, its licence, its code.
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "nb_accel")
BUILD_TIMEOUT_S = 300


def scratch_environment(scratch: Path) -> dict[str, str]:
    """This process's environment with the temporary folder moved into ``scratch``, so that what
    pip and the launches write there is removed with it."""
    scratch.mkdir(parents=True, exist_ok=True)
    return {**os.environ, "TMPDIR": str(scratch)}


def build_wheel(base: Path) -> Path:
    """``pip wheel --no-deps`` of a copy of the sources, in ``base``: the built wheel's path.
    Skips the test when the network keeps the build backend out of reach."""
    source = base / "source"
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(ROOT / name, source / name, ignore=ignore)
        elif (ROOT / name).exists():
            shutil.copy2(ROOT / name, source / name)
    env = pip_environment(scratch_environment(base / "tmp"), constraints=None)
    command = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "-w",
        str(base / "dist"),
        str(source),
    ]
    status, output = run(command, env, BUILD_TIMEOUT_S, cwd=base)
    if status != 0:
        skip_or_fail_install(output, "the build backend to build the wheel")
    built = sorted((base / "dist").glob("nb_accel-*.whl"))
    assert len(built) == 1, output
    return built[0]


def wheel_names(path: Path) -> list[str]:
    """The paths of the files in the wheel."""
    with zipfile.ZipFile(path) as archive:
        return archive.namelist()


def wheel_metadata(path: Path) -> Message:
    """The wheel's METADATA (core metadata: name, dependencies, URLs, licence, description)."""
    with zipfile.ZipFile(path) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return Parser().parsestr(archive.read(name).decode())
