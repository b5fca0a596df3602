"""GPU launches (skipped without CUDA): nccl on one GPU, and CUDA initialised before fork."""

from __future__ import annotations

import pytest
import torch

from nb_accel import LaunchError, PartialState, _env, notebook_launcher

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_env.cuda_device_count() == 0, reason="needs a CUDA GPU"),
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
    count = _env.cuda_device_count()
    results = notebook_launcher(nccl_all_reduce, num_processes=count)
    expected = count * (count + 1) / 2
    assert [r[2].item() for r in results] == [expected] * count
    assert [r[1] for r in results] == [f"cuda:{i}" for i in range(count)]


def test_cuda_initialised_before_fork_is_refused_with_a_fix() -> None:
    torch.zeros(1, device="cuda")  # initialises CUDA in this (kernel) process
    with pytest.raises(LaunchError, match=r"Restart the kernel.*start_method='spawn'"):
        notebook_launcher(nccl_all_reduce, num_processes=1, start_method="fork")
    [(backend, _device, value)] = notebook_launcher(
        nccl_all_reduce, num_processes=1, start_method="spawn"
    )
    assert backend == "nccl" and value.item() == 1.0
