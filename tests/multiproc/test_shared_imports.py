"""What every rank's ``prepare()`` imports (``DistributedDataParallel`` imports
``torch._dynamo``: about 800 modules, 1.2 s of a core) is imported once in the kernel before it
forks ranks, and shared by them: a forked rank finds it imported, and its ``prepare()`` imports
nothing more of it. Found by the chaos campaign, whose scenarios each spent 1.3 s per launch
in ``prepare()`` of a four-weight model. The launching process is a script of its own (this
test's process has imported ``torch._dynamo`` already)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

SCRIPT = """
import json, sys
import torch
from nb_accel import Accelerator, notebook_launcher

def imported_at_start():
    found = "torch._dynamo" in sys.modules
    before = set(sys.modules)
    accelerator = Accelerator(cpu=True)
    accelerator.prepare(torch.nn.Linear(4, 1))
    return found, sorted(name for name in set(sys.modules) - before if "_dynamo" in name)

if __name__ == "__main__":
    kernel_had_it = "torch._dynamo" in sys.modules
    results = notebook_launcher(imported_at_start, num_processes=2, start_method="fork")
    print(json.dumps({"kernel_had_it": kernel_had_it, "results": results}))
"""


def test_a_forked_rank_shares_what_prepare_imports(tmp_path: Path) -> None:
    script = tmp_path / "launch.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=100, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert not said["kernel_had_it"]  # the launch imported it, not the script
    for rank, (found, imported) in enumerate(said["results"]):
        assert found, f"rank {rank} had to import torch._dynamo itself"
        assert imported == [], (rank, imported)
