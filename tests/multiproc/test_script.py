"""A function defined in a ``__main__`` script launches with every start method."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import sys
import torch.distributed as dist
from nb_accel import notebook_launcher

OFFSET = 100

def work(x):
    return dist.get_rank() + x + OFFSET

def main():
    print("results:", notebook_launcher(work, args=(1,), num_processes=2, start_method=sys.argv[1]))

if len(sys.argv) > 2:
    main()  # no __main__ guard: fine for fork and spawn
elif __name__ == "__main__":
    main()  # forkserver re-imports the script in its workers, as in multiprocessing
"""


@pytest.mark.parametrize(
    "method, guarded", [("fork", False), ("spawn", False), ("forkserver", True)]
)
def test_function_defined_in_a_script(tmp_path: Path, method: str, guarded: bool) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    command = [sys.executable, str(script), method] + ([] if guarded else ["unguarded"])
    done = subprocess.run(command, capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr
    assert "results: [101, 102]" in done.stdout
