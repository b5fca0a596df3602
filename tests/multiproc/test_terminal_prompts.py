"""Outside a kernel, a worker's ``breakpoint()`` and ``input()`` ask on the terminal of the script
that launched: a real script run with its standard input answering, the prompts naming their
rank, ``c`` going on to the result, ``q`` ending the launch with :class:`DebuggerQuit`, and no
input at all failing ``input()`` at once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

SCRIPT = """
import sys
import torch, torch.distributed as dist
from nb_accel import notebook_launcher

def train(kind):
    total = torch.ones(1) * (dist.get_rank() + 1)
    if dist.get_rank() == 1:
        if kind == "breakpoint":
            hidden = total.item() * 7
            breakpoint()
        else:
            print("typed:", input("name? "))
    dist.all_reduce(total)
    return total.item()

if __name__ == "__main__":
    print("RESULT", notebook_launcher(train, args=(sys.argv[1],), num_processes=2))
"""


def _run(tmp_path: Path, kind: str, typed: str | None) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    return subprocess.run(
        [sys.executable, str(script), kind],
        input=typed,
        stdin=subprocess.DEVNULL if typed is None else None,
        capture_output=True,
        text=True,
        timeout=100,
        env={**os.environ, "NB_ACCEL_USE_CPU": "1"},
        check=False,
    )


def test_a_breakpoint_in_a_worker_asks_on_the_script_s_terminal(tmp_path: Path) -> None:
    done = _run(tmp_path, "breakpoint", "p hidden\nc\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("(Pdb rank 1) ") == 2
    assert "[rank 1] 14.0" in done.stdout
    assert "RESULT [3.0, 3.0]" in done.stdout


def test_q_ends_the_launch_with_debugger_quit(tmp_path: Path) -> None:
    done = _run(tmp_path, "breakpoint", "q\n")
    assert done.returncode == 1
    assert "DebuggerQuit" in done.stderr and "q in the debugger on rank 1" in done.stderr


def test_input_in_a_worker_is_answered_from_the_terminal(tmp_path: Path) -> None:
    done = _run(tmp_path, "input", "ada\n")
    assert done.returncode == 0, done.stderr
    assert "[rank 1] name? " in done.stdout and "[rank 1] typed: ada" in done.stdout
    nothing = _run(tmp_path, "input", None)
    assert nothing.returncode == 1 and "EOFError" in nothing.stderr
