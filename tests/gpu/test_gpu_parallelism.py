"""The device mesh on GPUs with NCCL (skipped without two CUDA GPUs): context parallelism (each
rank a half of every sequence, torch's ring attention) gives one GPU's loss and gradients for
the whole sequence; tensor parallelism with FSDP2 (2 x 2, skipped without four) trains to
DDP's weights."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nb_accel import Accelerator, ParallelismConfig, notebook_launcher
from nb_accel.runtime.device_types import cuda_facts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(300),
    pytest.mark.skipif(cuda_facts.cuda_device_count() < 2, reason="needs two CUDA GPUs"),
]

SEQUENCE, WIDTH, HEADS = 128, 64, 4


class CausalBlock(nn.Module):
    """One causal self-attention layer through ``scaled_dot_product_attention``."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.out = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, HEADS, -1).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(attended.transpose(1, 2).reshape(batch, length, WIDTH))


def _inputs(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, SEQUENCE, WIDTH, generator=generator)
    target = torch.randn(2, SEQUENCE, WIDTH, generator=generator)
    return x.to(device, torch.bfloat16), target.to(device, torch.bfloat16)


def context_parallel(cp_size: int) -> dict[str, Any]:
    """One step's loss (averaged over the ranks) and the whole gradient of ``qkv``."""
    accelerator = Accelerator(parallelism_config=ParallelismConfig(cp_size=cp_size))
    torch.manual_seed(0)
    model = accelerator.prepare(CausalBlock().to(torch.bfloat16))
    x, target = _inputs(accelerator.device)
    with accelerator.maybe_context_parallel(buffers=[x, target], buffer_seq_dims=[1, 1]):
        loss = F.mse_loss(model(x), target)
        accelerator.backward(loss)
    grad = accelerator.unwrap_model(model).qkv.weight.grad
    return {
        "loss": float(accelerator.reduce(loss.detach().float(), "mean")),
        "grad": grad.float().cpu(),
    }


def one_gpu() -> dict[str, Any]:
    torch.manual_seed(0)
    model = CausalBlock().to(torch.bfloat16).cuda()
    x, target = _inputs(torch.device("cuda"))
    loss = F.mse_loss(model(x), target)
    loss.backward()
    return {"loss": float(loss.float()), "grad": model.qkv.weight.grad.float().cpu()}


def test_context_parallelism_gives_one_gpus_loss_and_gradients() -> None:
    split = notebook_launcher(context_parallel, args=(2,), num_processes=2)
    whole = notebook_launcher(one_gpu, num_processes=1)[0]
    assert abs(split[0]["loss"] - whole["loss"]) < 1e-2 * abs(whole["loss"])
    torch.testing.assert_close(split[0]["grad"], whole["grad"], rtol=5e-2, atol=5e-3)
    torch.testing.assert_close(split[0]["grad"], split[1]["grad"])


def tensor_parallel_steps(sizes: dict[str, int]) -> list[dict[str, torch.Tensor]]:
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    accelerator = Accelerator(parallelism_config=ParallelismConfig(**sizes))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
    if sizes.get("tp_size", 1) > 1:
        plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
        parallelize_module(model, accelerator.torch_device_mesh["tp"], plan)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    place = accelerator.process_index // sizes.get("tp_size", 1)
    weights = []
    for step in range(3):
        generator = torch.Generator().manual_seed(100 * step + place)
        x = torch.randn(8, 32, generator=generator).to(accelerator.device)
        accelerator.backward(model(x).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()
        whole = accelerator.get_state_dict(model)
        weights.append({k: v.float().cpu().clone() for k, v in whole.items()})
    return weights


@pytest.mark.skipif(cuda_facts.cuda_device_count() < 4, reason="needs four CUDA GPUs")
def test_tensor_parallelism_with_fsdp_trains_to_ddps_weights() -> None:
    parallel = notebook_launcher(
        tensor_parallel_steps, args=({"tp_size": 2, "dp_shard_size": 2},), num_processes=4
    )[0]
    ddp = notebook_launcher(
        tensor_parallel_steps, args=({"dp_replicate_size": 2},), num_processes=2
    )[0]
    for mine, theirs in zip(parallel, ddp, strict=True):
        for name, value in mine.items():
            torch.testing.assert_close(value, theirs[name], rtol=1e-4, atol=1e-5)
