"""DDP communication hooks on NCCL and the profiler on a GPU (skipped without CUDA)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nb_accel import Accelerator, notebook_launcher
from nb_accel.runtime.device_types import cuda_facts
from nb_accel.runtime.training.profiling import ProfilingMethods
from nb_accel.utils import DistributedDataParallelKwargs, ProfileKwargs, set_seed

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(cuda_facts.cuda_device_count() == 0, reason="needs a CUDA GPU"),
]
two_gpus = pytest.mark.skipif(cuda_facts.cuda_device_count() < 2, reason="needs two CUDA GPUs")


def bf16_first_step() -> dict[str, Any]:
    accelerator = Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(comm_hook="bf16")])
    set_seed(0)
    model = torch.nn.Linear(16, 1)
    local = torch.nn.Linear(16, 1).to(accelerator.device)
    local.load_state_dict(model.state_dict())
    model = accelerator.prepare(model)
    generator = torch.Generator().manual_seed(accelerator.process_index)
    x = torch.randn(8, 16, generator=generator).to(accelerator.device)
    torch.nn.functional.mse_loss(local(x), x.sum(1, keepdim=True)).backward()
    own = torch.cat([p.grad.flatten() for p in local.parameters()])
    expected = accelerator.gather(own[None]).mean(dim=0)
    accelerator.backward(torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)))
    averaged = torch.cat([p.grad.flatten() for p in model.parameters()])
    return {
        "hook": model._get_ddp_logging_data().get("comm_hook"),
        "averaged": averaged.cpu(),
        "expected": expected.cpu(),
    }


@two_gpus
@pytest.mark.timeout(300)
def test_the_bf16_hook_averages_gradients_over_nccl() -> None:
    for result in notebook_launcher(bf16_first_step, num_processes=2):
        assert result["hook"] == "bf16_compress_hook"
        torch.testing.assert_close(result["averaged"], result["expected"], rtol=2e-2, atol=1e-2)


class _ProfiledAccelerator(Accelerator, ProfilingMethods):
    """The Accelerator with the profiling mixin."""


def profile_a_gpu_matmul() -> float:
    accelerator = _ProfiledAccelerator(kwargs_handlers=[ProfileKwargs(activities=["cpu", "cuda"])])
    with accelerator.profile() as prof:
        a = torch.ones(256, 256, device=accelerator.device)
        (a @ a).sum().item()
    return float(sum(event.self_device_time_total for event in prof.key_averages()))


@pytest.mark.timeout(300)
def test_profile_records_gpu_time_with_the_cuda_activity() -> None:
    assert notebook_launcher(profile_a_gpu_matmul, num_processes=1)[0] > 0
