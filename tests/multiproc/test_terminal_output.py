"""A launch on a terminal: printed lines never land on the line of rank 0's progress bar."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

#: Every rank prints while rank 0's bar runs.
SCRIPT = """
import time
import torch.distributed as dist
from nb_accel import notebook_launcher, tqdm

def train():
    rank = dist.get_rank()
    for step in tqdm(range(STEPS), desc="training"):
        time.sleep(0.03)
        print(f"printed {step} by {rank}")

notebook_launcher(train, num_processes=2)
""".replace("STEPS", "40")

#: How long the launch may take in the pseudo-terminal (seconds).
RUN_TIMEOUT_S = 90.0


def screen_lines(raw: str) -> list[str]:
    """The lines a terminal shows for ``raw``: a carriage return goes back to the start of the
    line, and what follows overwrites it."""
    lines: list[str] = []
    line: list[str] = []
    column = 0
    for char in raw:
        if char == "\n":
            lines.append("".join(line).rstrip())
            line, column = [], 0
        elif char == "\r":
            column = 0
        else:
            if column < len(line):
                line[column] = char
            else:
                line.append(char)
            column += 1
    if line:
        lines.append("".join(line).rstrip())
    return lines


def run_in_terminal(script: str, cwd: Path) -> str:
    """Run ``script`` with stdout and stderr on a pseudo-terminal; everything it showed."""
    main, secondary = os.openpty()
    process = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.DEVNULL,
        stdout=secondary,
        stderr=secondary,
        cwd=cwd,
    )
    os.close(secondary)
    chunks: list[bytes] = []
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # every writer has closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        process.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(main)
    assert process.returncode == 0, b"".join(chunks).decode(errors="replace")
    return b"".join(chunks).decode(errors="replace")


@pytest.mark.timeout(120)
def test_printed_lines_and_the_bar_never_share_a_line(tmp_path: Path) -> None:
    lines = screen_lines(run_in_terminal(SCRIPT, tmp_path))
    printed = [line for line in lines if "printed" in line]
    bars = [line for line in lines if "training" in line]
    assert bars, lines  # the bar was drawn
    assert not [line for line in printed if "training" in line], lines
    for rank in (0, 1):  # each line once, in order, with its rank from the first on
        mine = [line for line in printed if line.startswith(f"[rank {rank}] ")]
        assert mine == [f"[rank {rank}] printed {step} by {rank}" for step in range(40)]
    assert len(printed) == 80
