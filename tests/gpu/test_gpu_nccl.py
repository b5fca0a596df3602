"""NCCL process groups (skipped without CUDA): each is bound to its rank's GPU and made at once,
its store waits as long as the launch's timeout, a rank that reaches the first collective late
is waited for, a collective that NCCL's watchdog times out is a ``CollectiveTimeoutError`` that
says which collective the rank that did not come last entered (torch's flight recorder, on
for every worker)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from nb_accel import Accelerator, CollectiveTimeoutError, notebook_launcher
from nb_accel.runtime.device_types import cuda_facts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(cuda_facts.cuda_device_count() == 0, reason="needs a CUDA GPU"),
]
two_gpus = pytest.mark.skipif(cuda_facts.cuda_device_count() < 2, reason="needs two CUDA GPUs")


def group_binding() -> tuple[str, str, float]:
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    Accelerator()
    group = distributed_c10d._get_default_group()
    store = distributed_c10d._get_default_store()
    return dist.get_backend(), str(group.bound_device_id), store.timeout.total_seconds()


def test_each_rank_s_group_is_bound_to_its_gpu_and_its_store_waits_the_launch_timeout() -> None:
    count = cuda_facts.cuda_device_count()
    results = notebook_launcher(group_binding, num_processes=count, timeout=1234)
    assert results == [("nccl", f"cuda:{rank}", 1234.0) for rank in range(count)]
    assert not torch.cuda.is_initialized()  # the launcher never touched CUDA in this process


def rank_zero_downloads_first(seconds: float) -> float:
    import torch.distributed as dist

    accelerator = Accelerator()
    with accelerator.main_process_first():
        if accelerator.is_main_process:
            time.sleep(seconds)  # a model download, say
    value = torch.ones(1, device=accelerator.device)
    dist.all_reduce(value)
    return value.item()


@two_gpus
@pytest.mark.timeout(300)
def test_a_rank_late_at_the_first_collective_is_waited_for() -> None:
    assert notebook_launcher(rank_zero_downloads_first, args=(5.0,), num_processes=2) == [2.0, 2.0]


def rank_one_never_arrives() -> float:
    import torch.distributed as dist

    accelerator = Accelerator()
    value = torch.ones(1, device=accelerator.device)
    dist.all_reduce(value)
    if accelerator.process_index == 1:
        time.sleep(600)  # stopped long before: rank 0 gives up after the timeout
    dist.all_reduce(value)
    return value.item()  # waits for the all-reduce that never completes


@two_gpus
@pytest.mark.timeout(300)
def test_a_collective_past_the_timeout_is_a_collective_timeout_error() -> None:
    """The rank keeps the launch's timeout itself (torch's deadline, NCCL's watchdog's, is far
    away): rank 0, waiting in an NCCL all-reduce, times out after the launch's 10 s."""
    with pytest.raises(
        CollectiveTimeoutError, match=r"timed out after 10 s on rank 0 of 2"
    ) as info:
        notebook_launcher(rank_one_never_arrives, num_processes=2, timeout=10)
    message = str(info.value)  # rank 1 sleeps after the first all-reduce: its last collective
    assert "Rank 1 did not arrive (was still running, at `rank_one_never_arrives`" in message
    assert re.search(r"; last collective: all_reduce #\d+", message), message


#: A one-rank NCCL group runs an all-reduce; the trail says it, and once NCCL is done with it,
#: says it finished (gloo cannot tell).
NCCL_TRAIL = """
import json, sys, time
import torch, torch.distributed as dist
from nb_accel.worker.reporting.collective_trail import enable_flight_recorder, last_collective
enable_flight_recorder()
dist.init_process_group(
    "nccl", init_method="file://" + sys.argv[1], rank=0, world_size=1,
    device_id=torch.device("cuda:0"),
)
dist.all_reduce(torch.ones(1, device="cuda:0"))
torch.cuda.synchronize()
found = last_collective()
deadline = time.monotonic() + 30
while found is not None and found.state != "completed" and time.monotonic() < deadline:
    time.sleep(0.1)  # NCCL's watchdog marks it finished
    found = last_collective()
print(json.dumps([found.describe() if found else None, found.state if found else None]))
dist.destroy_process_group()
"""


@pytest.mark.timeout(120)
def test_nccl_s_flight_recorder_names_the_last_collective_and_its_end(tmp_path: Path) -> None:
    output = subprocess.run(
        [sys.executable, "-c", NCCL_TRAIL, str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=100,
        check=True,
    ).stdout
    said, state = json.loads(output.strip().splitlines()[-1])
    assert said is not None and said.startswith("all_reduce #1"), said
    assert state in ("completed", "started", "scheduled")
