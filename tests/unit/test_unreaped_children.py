"""A host's agent stops its workers without reaping them (torch reads their exit codes after):
a frozen one is continued and ended, one that ignores SIGTERM is killed after the grace, one
that already ended is left as it is, and a process that is not a child is never signalled."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from nb_accel.launch.multinode.unreaped import UnreapedChild, ended_unreaped, stop_children

pytestmark = pytest.mark.timeout(60)

IGNORES_SIGTERM = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def _child(code: str) -> subprocess.Popen[str]:
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline() == "ready\n"
    return child


def test_a_frozen_child_and_one_that_ignores_sigterm_are_ended_and_left_unreaped() -> None:
    frozen = _child("import time; print('ready', flush=True); time.sleep(60)")
    stubborn = _child(IGNORES_SIGTERM)
    try:
        frozen.send_signal(signal.SIGSTOP)
        stop_children([frozen.pid, stubborn.pid])
        # their exits are still there to be read (a reaped child would read as exit code 0)
        assert frozen.wait(5) == -signal.SIGTERM  # continued, it acted on the SIGTERM
        assert stubborn.wait(5) == -signal.SIGKILL  # past the grace
    finally:
        for child in (frozen, stubborn):
            child.kill()
            child.wait()
            child.stdout.close()  # type: ignore[union-attr]


def test_a_process_that_is_not_a_child_is_never_signalled() -> None:
    """As a pid torch has reaped (which the system may give to another process): this test's
    own process, no child of itself, is left alone, as is a child already reaped."""
    reaped = subprocess.Popen([sys.executable, "-c", "pass"])
    reaped.wait()
    stop_children([os.getpid(), reaped.pid])  # a SIGTERM would end this test
    UnreapedChild(os.getpid()).signal(signal.SIGTERM)  # one torch reaps as the stop runs
    assert ended_unreaped(os.getpid()) is None
