"""A collective timeout that passes while a rank sits at its pdb prompt says the rank was there,
not what it did once the prompt was answered: a real script launches two ranks, rank 1 stops at
``breakpoint()`` and rank 0 waits for it in ``all_reduce`` with a 2 s timeout; the prompt is
answered (``c``) only once rank 0's deadline has passed, and rank 1 then goes on to the
``all_reduce`` and returns.

Time at a prompt is left out of a rank's timeout, so rank 0 is made to count it here (its
deadline reads no prompt time, as a rank whose clock heard of the prompt late would): the
deadline passes while the prompt is open, which the rank's prompt clock still says. The steps
are ordered by marker files: the test sees the prompt, rank 0 then enters its ``all_reduce``;
rank 0's deadline passes and its timeout is reported, the test then answers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from markers import wait_for_files, wait_until

pytestmark = pytest.mark.timeout(120)

SCRIPT = """
import sys, time
from pathlib import Path
import torch, torch.distributed as dist
from nb_accel import notebook_launcher

def train(folder):
    total = torch.ones(1)
    if dist.get_rank() == 0:
        from nb_accel.worker.debugging import deadline

        for kept in deadline._active:  # the test answers once the timeout has been reported
            reported = kept.expired

            def expired(*details, reported=reported):
                reported(*details)
                Path(folder, "deadline-passed").touch()

            kept.expired = expired
        deadline.prompt_seconds = lambda clock, now=None: 0.0  # the prompt's time counts
        waited = time.monotonic() + 60
        while not Path(folder, "prompt-open").exists() and time.monotonic() < waited:
            time.sleep(0.01)
    else:
        breakpoint()
    dist.all_reduce(total)
    return total.item()

if __name__ == "__main__":
    print("RESULT", notebook_launcher(train, args=(sys.argv[1],), num_processes=2, timeout=2))
"""

#: The line rank 1's debugger stops at: the one after its ``breakpoint()``.
STOPPED_AT = next(
    n for n, line in enumerate(SCRIPT.splitlines(), start=1) if "dist.all_reduce" in line
)


def test_a_rank_at_its_prompt_when_the_timeout_passed_is_said_to_be_there(tmp_path: Path) -> None:
    script, out, err = tmp_path / "train.py", tmp_path / "out.txt", tmp_path / "err.txt"
    script.write_text(SCRIPT)
    with out.open("w") as stdout, err.open("w") as stderr:
        launched = subprocess.Popen(
            [sys.executable, str(script), str(tmp_path)],
            stdin=subprocess.PIPE,
            stdout=stdout,
            stderr=stderr,
            text=True,
            env={**os.environ, "NB_ACCEL_USE_CPU": "1"},
        )
    try:
        wait_until(lambda: "(Pdb rank 1) " in out.read_text(), "rank 1's prompt", 60)
        (tmp_path / "prompt-open").touch()  # rank 0 enters its all_reduce
        wait_for_files(tmp_path / "deadline-passed", timeout_s=30)
        assert launched.stdin is not None
        launched.stdin.write("c\n")
        launched.stdin.close()
        launched.wait(timeout=60)
    finally:
        if launched.poll() is None:
            launched.kill()
            launched.wait()
    stdout_text, stderr_text = out.read_text(), err.read_text()
    assert "RESULT" not in stdout_text, stdout_text  # the timeout ended the launch
    message = stderr_text
    assert "A collective timed out after 2 s on rank 0 of 2 (in all_reduce" in message, message
    at = f"(was at a pdb prompt, at `train` (train.py, line {STOPPED_AT}))"
    assert f"Rank 1 did not arrive {at}" in message, message
    assert "had already returned" not in message, message
