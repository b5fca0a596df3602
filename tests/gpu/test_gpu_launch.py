"""GPU launches (skipped without CUDA): nccl on every GPU, each start method, and a kernel
that initialised CUDA before a fork launch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nb_accel import PartialState, notebook_launcher
from nb_accel.runtime.device_types import cuda_facts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(cuda_facts.cuda_device_count() == 0, reason="needs a CUDA GPU"),
]


def nccl_all_reduce() -> tuple[str, str, float]:
    import torch.distributed as dist

    state = PartialState()
    value = torch.ones(1, device=state.device) * (state.process_index + 1)
    dist.all_reduce(value)
    return dist.get_backend(), str(state.device), value  # type: ignore[return-value]


def test_single_gpu_nccl_launch_returns_cpu_tensors() -> None:
    assert not torch.cuda.is_initialized()
    [(backend, device, value)] = notebook_launcher(nccl_all_reduce, num_processes=1)
    assert backend == "nccl" and device == "cuda:0"
    assert value.device.type == "cpu" and value.item() == 1.0
    assert not torch.cuda.is_initialized()  # the launcher never touched CUDA in this process


def test_all_gpus_nccl_launch() -> None:
    count = cuda_facts.cuda_device_count()
    results = notebook_launcher(nccl_all_reduce, num_processes=count)
    expected = count * (count + 1) / 2
    assert [r[2].item() for r in results] == [expected] * count
    assert [r[1] for r in results] == [f"cuda:{i}" for i in range(count)]


#: A kernel that used CUDA before launching: run as its own process, so that this pytest
#: process never initialises CUDA (every later fork launch of the suite would be refused).
CUDA_FIRST = """
import torch
from nb_accel import LaunchError, notebook_launcher


def all_reduce():
    import torch.distributed as dist
    value = torch.ones(1, device="cuda")
    dist.all_reduce(value)
    return dist.get_backend(), value.item()


if __name__ == "__main__":
    torch.zeros(1, device="cuda")
    try:
        notebook_launcher(all_reduce, num_processes=1, start_method="fork")
    except LaunchError as error:
        print("refused:", error)
    print("spawned:", notebook_launcher(all_reduce, num_processes=1, start_method="spawn"))
"""


@pytest.mark.timeout(300)
def test_cuda_initialised_before_fork_is_refused_with_a_fix(tmp_path: Path) -> None:
    script = tmp_path / "cuda_first.py"
    script.write_text(CUDA_FIRST)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=280, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "refused:" in done.stdout  # an explicit fork keeps the clear error
    assert "spawned: [('nccl', 1.0)]" in done.stdout


def spawned_rank() -> tuple[str, str, float]:
    return nccl_all_reduce()


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
@pytest.mark.timeout(300)
def test_spawn_and_forkserver_launches_on_gpus(start_method: str) -> None:
    count = cuda_facts.cuda_device_count()
    results = notebook_launcher(spawned_rank, num_processes=count, start_method=start_method)
    assert [r[0] for r in results] == ["nccl"] * count
    assert [r[2].item() for r in results] == [count * (count + 1) / 2] * count
    assert not torch.cuda.is_initialized()


def what_the_cuda_type_gave() -> tuple[str, str, int, str, bool]:
    import torch.distributed as dist

    from nb_accel import Accelerator

    accelerator = Accelerator()
    model = accelerator.prepare(torch.nn.Linear(4, 4))
    scratch = torch.empty(64 * 2**20, dtype=torch.uint8, device=accelerator.device)
    del scratch  # 64 MiB the allocator keeps cached
    cached = torch.cuda.memory_reserved()
    accelerator.free_memory()
    return (
        accelerator.state.device_type.name,
        str(torch.cuda.current_device()),
        model.device_ids[0] if hasattr(model, "device_ids") else -1,
        dist.get_backend(),
        torch.cuda.memory_reserved() <= cached - 64 * 2**20,
    )


def test_the_cuda_device_type_places_binds_and_empties_each_rank(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The CUDA device type, asked on both sides: the title and the backend in the kernel; the
    rank's current device, DDP's device ids and the emptied cache in each worker."""
    count = min(cuda_facts.cuda_device_count(), 2)
    results = notebook_launcher(what_the_cuda_type_gave, num_processes=count)
    assert f"Launching {count} process" in capsys.readouterr().out
    for rank, (kind, current, device_id, backend, emptied) in enumerate(results):
        assert (kind, current, backend, emptied) == ("cuda", str(rank), "nccl", True)
        assert device_id in (rank, -1)  # -1: a single process is left unwrapped
    sharded = notebook_launcher(what_the_cuda_type_gave, num_processes=count, sharding="fsdp2")
    assert all(backend == "cuda:nccl,cpu:gloo" for _, _, _, backend, _ in sharded)
