"""The launcher interface and what the launchers share: every launcher implements it, only the
chooser reaches the XLA launcher, and stopping leaves no process behind."""

from __future__ import annotations

import ast
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import nb_accel
from nb_accel.launch.launchers.interface import Launcher
from nb_accel.launch.launchers.stopping import stop_processes
from nb_accel.launch.multinode.launcher import NodesLauncher
from nb_accel.launch.pool import WorkerPool
from nb_accel.launch.processes import WorkerProcess
from nb_accel.launch.single_node import SingleNodeLauncher
from nb_accel.launch.xla.launcher import XlaLauncher

LAUNCH = Path(nb_accel.__file__).parent / "launch"


@pytest.mark.parametrize("launcher", [SingleNodeLauncher, NodesLauncher, XlaLauncher, WorkerPool])
def test_every_launcher_implements_the_interface(launcher: type[Launcher]) -> None:
    assert issubclass(launcher, Launcher)
    assert not launcher.__abstractmethods__, launcher.__abstractmethods__


def _imports_xla(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and "xla" in node.module.split("."):
            return True
        if isinstance(node, ast.Import) and any("xla" in a.name.split(".") for a in node.names):
            return True
    return False


def test_only_the_registry_of_backends_imports_the_xla_launcher() -> None:
    outside = [p for p in LAUNCH.rglob("*.py") if "xla" not in p.relative_to(LAUNCH).parts]
    importers = sorted(str(p.relative_to(LAUNCH)) for p in outside if _imports_xla(p))
    assert importers == ["backends.py"]


#: A worker that ignores SIGTERM and has started a child of its own (in its process group).
STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(child.pid, flush=True)
time.sleep(120)
"""
#: A worker that ends on SIGTERM, as most do.
OBEDIENT = "import time; print(0, flush=True); time.sleep(120)"


@contextmanager
def _worker(code: str) -> Iterator[tuple[WorkerProcess, subprocess.Popen[str], int]]:
    """A worker process leading its own process group, and the pid its first line names."""
    popen = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    ours, theirs = multiprocessing.Pipe()
    theirs.close()
    worker = WorkerProcess(0, popen.pid, ours, popen)
    try:
        assert popen.stdout is not None
        yield worker, popen, int(popen.stdout.readline())  # set up once it has said so
    finally:
        if popen.poll() is None:
            os.killpg(popen.pid, signal.SIGKILL)
        popen.wait()
        popen.stdout.close()  # type: ignore[union-attr]
        worker.close()


def _gone(pid: int, within: float) -> bool:
    """Whether process ``pid`` ends (or is a zombie, dead but not yet reaped) in time."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def test_stopping_kills_a_worker_that_ignores_sigterm_and_what_it_started() -> None:
    with _worker(STUBBORN) as (worker, popen, grandchild):
        stop_processes([worker], grace=0.5)
        assert popen.wait(timeout=10) == -signal.SIGKILL
        assert _gone(grandchild, 10)  # the worker's process group went with it


def test_a_worker_that_obeys_sigterm_is_not_killed() -> None:
    with _worker(OBEDIENT) as (worker, popen, _):
        stop_processes([worker], grace=10.0)
        assert popen.wait(timeout=10) == -signal.SIGTERM
