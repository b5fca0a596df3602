"""Accelerate's tests, taken at run time and never kept in this repository.

The multi-process scripts come from the ``accelerate`` package installed in this venv, its
unit tests (``tests/test_data_loader.py``) from its source distribution on the package index.
``rewrite`` turns either into its nb_accel twin: the word ``accelerate`` in the imports becomes
``nb_accel``, except for ``accelerate.test_utils``, the tests' own fixtures, which
``suite_fixtures`` provides.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import subprocess
import sys
import tarfile
from pathlib import Path

#: The Accelerate release whose tests the suite runs (the Makefile installs the same one).
VERSION = "1.15.0"
#: The multi-process scripts, from ``accelerate/test_utils/scripts/``.
SCRIPTS = (
    "test_script",
    "test_sync",
    "test_ops",
    "test_distributed_data_loop",
    "test_ddp_comm_hook",
)
#: The unit tests taken from the source distribution.
UNIT_TESTS = ("test_data_loader", "test_tracking", "test_dataclasses")

_FIXTURES = re.compile(r"\baccelerate\.test_utils(?:\.testing|\.training)?\b")
_IMPORT = re.compile(r"^(\s*)(from|import)(\s+)accelerate\b", re.MULTILINE)


def check_installed_version() -> str | None:
    """Why the suite cannot run here (``None`` when it can)."""
    try:
        installed = importlib.metadata.version("accelerate")
    except importlib.metadata.PackageNotFoundError:
        return "accelerate is not installed (make test-accelerate installs it)"
    if installed != VERSION:
        return f"the suite runs Accelerate {VERSION}'s tests, but {installed} is installed"
    return None


def installed_script(name: str) -> Path:
    """The path of one of Accelerate's test scripts in the installed package (not imported)."""
    spec = importlib.util.find_spec("accelerate")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("accelerate is not installed")
    folder = Path(next(iter(spec.submodule_search_locations)))
    return folder / "test_utils" / "scripts" / f"{name}.py"


def download_unit_tests(folder: Path) -> dict[str, Path]:
    """Download Accelerate's source distribution into ``folder`` and extract its unit tests."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-binary",
            ":all:",
            "--no-deps",
            "--dest",
            str(folder),
            f"accelerate=={VERSION}",
        ],
        check=True,
        timeout=300,
    )
    archive = next(folder.glob(f"accelerate-{VERSION}.tar.gz"))
    found: dict[str, Path] = {}
    with tarfile.open(archive) as tar:
        for name in UNIT_TESTS:
            member = tar.getmember(f"accelerate-{VERSION}/tests/{name}.py")
            source = tar.extractfile(member)
            if source is None:
                raise RuntimeError(f"{member.name} is not a file in {archive.name}")
            found[name] = folder / f"{name}.py"
            found[name].write_bytes(source.read())
    return found


def rewrite(source: str) -> str:
    """The nb_accel twin of a test file: its imports name ``nb_accel`` instead of
    ``accelerate`` (and ``suite_fixtures`` instead of ``accelerate.test_utils``)."""
    source = _FIXTURES.sub("suite_fixtures", source)
    return _IMPORT.sub(r"\1\2\3nb_accel", source)
