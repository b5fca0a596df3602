"""Debugging a rank on a GPU (skipped without CUDA), in a real kernel whose prompts are answered
through Jupyter's stdin channel: ``%debug`` after a cold launch opens the raising rank's frames
with its CUDA tensors still on the GPU, and ``breakpoint()`` in a worker that holds CUDA memory
stops at a prompt in the notebook and continues to the launch's result; on two GPUs a
``%%distributed`` pool waits out a held prompt and frees itself past its timeout."""

from __future__ import annotations

from pathlib import Path

import pytest
from kernel_driver import run_answering, run_cell, running_kernel

from nb_accel.runtime.device_types import cuda_facts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(cuda_facts.cuda_device_count() == 0, reason="needs a CUDA GPU"),
    pytest.mark.timeout(300),
]

CHILDREN = "import psutil; print(sorted(p.pid for p in psutil.Process().children(recursive=True)))"

RAISING = """
import torch, torch.distributed as dist
from nb_accel import PartialState, notebook_launcher

def train():
    weights = torch.arange(4.0, device=PartialState().device) * 2
    dist.all_reduce(weights)
    raise ValueError("diverged on the GPU")

notebook_launcher(train, num_processes={count})
"""

STOPPING = """
import torch, torch.distributed as dist
from nb_accel import PartialState, notebook_launcher

def train():
    total = torch.ones(8, device=PartialState().device)
    dist.all_reduce(total)
    breakpoint()
    return total.sum().item()

print(notebook_launcher(train, num_processes={count}))
"""


def test_debug_after_a_cold_launch_sees_the_ranks_cuda_tensors() -> None:
    count = cuda_facts.cuda_device_count()
    with running_kernel() as (_, client):
        failed = run_cell(client, RAISING.format(count=count))
        assert failed.ename == "ValueError", failed.stderr
        assert "%debug opens the debugger on rank" in "\n".join(failed.traceback)
        run, prompts = run_answering(
            client, "%debug", ["p weights.device.type, weights.sum().item()", "q"]
        )
        assert prompts[0].startswith("(Pdb rank "), run.stderr
        assert f"('cuda', {12.0 * count})" in run.stdout
        assert run_cell(client, CHILDREN).stdout.strip() == "[]"  # the kept rank ended


def test_a_breakpoint_on_a_gpu_rank_asks_in_the_notebook_and_continues() -> None:
    count = cuda_facts.cuda_device_count()
    with running_kernel() as (_, client):
        answers = ["p total.device.type, total.sum().item()", "c"] * count
        run, prompts = run_answering(client, STOPPING.format(count=count), answers)
        assert run.status == "ok", run.stderr + run.evalue
        assert sorted(prompts) == sorted(f"(Pdb rank {r}) " for r in range(count) for _ in "pc")
        assert f"('cuda', {8.0 * count})" in run.stdout
        assert str([8.0 * count] * count) in run.stdout  # the launch's result, every rank's
        assert run_cell(client, CHILDREN).stdout.strip() == "[]"


#: A pool on two GPUs whose collective timeout is 10 s (the saved configuration's).
SHORT_TIMEOUT_POOL = """
import os
from nb_accel.config import Config, save_config
os.environ["NB_ACCEL_CONFIG_FILE"] = {path!r}
save_config(Config(timeout=10.0, num_processes=2), {path!r})
%load_ext nb_accel
"""
HELD_AT_RANK_1 = """%%distributed
import torch, torch.distributed as dist
total = torch.ones(4, device=accelerator.device) * (rank + 1)
if rank == 1:
    breakpoint()
dist.all_reduce(total)
print('sum', total.sum().item())
"""
NEVER_MATCHED = """%%distributed
if rank == 0:
    dist.all_reduce(total)
else:
    dist.recv(total, src=0)
torch.cuda.synchronize()
"""


@pytest.mark.skipif(cuda_facts.cuda_device_count() < 2, reason="needs two CUDA GPUs")
def test_a_pool_on_nccl_waits_out_a_prompt_and_frees_itself_past_its_timeout(
    tmp_path: Path,
) -> None:
    """In %%distributed on NCCL a prompt held for twice the pool's timeout does not fail rank 0
    waiting in its all_reduce; collectives that never match end at the timeout (each rank
    aborts its own communicator) and the next cell runs on a rebuilt group."""
    with running_kernel() as (_, client):
        setup = run_cell(client, SHORT_TIMEOUT_POOL.format(path=str(tmp_path / "config.yaml")))
        assert setup.status == "ok", setup.evalue
        run, prompts = run_answering(client, HELD_AT_RANK_1, ["c"], hold_s=20.0)
        assert run.status == "ok", run.stderr + run.evalue
        assert prompts == ["(Pdb rank 1) "] and "sum 12.0" in run.stdout
        stuck = run_cell(client, NEVER_MATCHED)
        assert stuck.ename == "CollectiveTimeoutError", stuck.stderr + stuck.evalue
        again = run_cell(client, HELD_AT_RANK_1.replace("breakpoint()", "pass"))
        assert "sum 12.0" in again.stdout, again.stderr + again.evalue
