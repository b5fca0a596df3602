"""The kernel's short commands (``ssh -G``, ``scontrol``) are reaped on every way out: an
interrupt (the notebook's stop button) in the middle of one leaves no zombie behind, where
``subprocess.run`` leaves one until the garbage collector comes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nb_accel.launch.placement.short_commands import command_output

pytestmark = pytest.mark.timeout(60)

# Interrupted as its command runs (once the command has said so through a FIFO), or past a
# short timeout, the process lists the children it has left unreaped.
ENDED_EARLY = """
import json, os, signal, subprocess, sys, threading
from nb_accel.launch.placement.short_commands import command_output

started, how = sys.argv[1:]
def interrupt():
    with open(started) as fifo:  # the command opened it for writing: it runs
        fifo.read()
    os.kill(os.getpid(), signal.SIGINT)
if how == "interrupt":
    threading.Thread(target=interrupt, daemon=True).start()
try:
    command = ["sh", "-c", f"exec 3>{started}; exec 3>&-; exec sleep 60"]
    command_output(command, timeout=50 if how == "interrupt" else 0.5)
except (KeyboardInterrupt, subprocess.TimeoutExpired):
    pass
left = []
try:
    while True:
        pid, _ = os.waitpid(-1, os.WNOHANG)
        if pid == 0:  # a child that still runs
            left.append("running")
            break
        left.append(pid)
except ChildProcessError:  # no child at all
    pass
print(json.dumps(left))
"""


@pytest.mark.parametrize("how", ["interrupt", "timeout"])
def test_a_command_ended_early_is_killed_and_reaped(how: str, tmp_path: Path) -> None:
    fifo = tmp_path / "started"
    os.mkfifo(fifo)
    if how == "timeout":  # the command waits for no reader
        fifo = tmp_path / "file"
    ran = subprocess.run(
        [sys.executable, "-c", ENDED_EARLY, str(fifo), how],
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout) == []


def test_output_and_exit_code() -> None:
    ran = command_output(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=10)
    assert (ran.returncode, ran.stdout, ran.stderr) == (3, "out\n", "err\n")


def test_an_interrupt_during_a_child_s_start_is_raised_after_it() -> None:
    import signal

    from nb_accel.launch.placement.short_commands import interrupt_deferred

    after: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        with interrupt_deferred():
            os.kill(os.getpid(), signal.SIGINT)  # as the stop button, mid-start
            after.append("the block went on")
    assert after == ["the block went on"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
