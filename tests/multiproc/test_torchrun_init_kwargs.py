"""Under ``torchrun`` the ``Accelerator`` creates the process group, with the options of
``InitProcessGroupKwargs``."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from loopback_torchrun import torchrun_command, torchrun_env

SCRIPT = """
from datetime import timedelta
import torch.distributed as dist
from torch.distributed import distributed_c10d
from nb_accel import Accelerator, InitProcessGroupKwargs

handler = InitProcessGroupKwargs(backend="gloo", timeout=timedelta(seconds=77))
accelerator = Accelerator(cpu=True, kwargs_handlers=[handler])
store_timeout = distributed_c10d._get_default_store().timeout.total_seconds()
print(f"rank {dist.get_rank()}: {dist.get_backend()} {store_timeout:g}", flush=True)
accelerator.wait_for_everyone()
dist.destroy_process_group()
"""


@pytest.mark.timeout(120)
def test_torchrun_creates_the_group_with_the_handlers_options(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    command = torchrun_command([str(script)])
    done = subprocess.run(
        command, env=torchrun_env(), capture_output=True, text=True, timeout=100, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "rank 0: gloo 77" in done.stdout and "rank 1: gloo 77" in done.stdout
