"""FSDP2 on GPUs with NCCL (skipped without two CUDA GPUs): the same training as DDP, a bf16
mixed precision policy, and CPU offload of the shards."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nb_accel import Accelerator, FullyShardedDataParallelPlugin, _env, notebook_launcher

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(300),
    pytest.mark.skipif(_env.cuda_device_count() < 2, reason="needs two CUDA GPUs"),
]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 64), torch.nn.Linear(64, 4)
    )


def train(plugin_options: dict[str, Any] | None, mixed_precision: str = "no") -> dict[str, Any]:
    plugin = None if plugin_options is None else FullyShardedDataParallelPlugin(**plugin_options)
    accelerator = Accelerator(fsdp_plugin=plugin, mixed_precision=mixed_precision)
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    generator = torch.Generator().manual_seed(accelerator.process_index)
    losses = []
    for _ in range(8):
        x = torch.randn(16, 32, generator=generator).to(accelerator.device)
        loss = model(x).float().pow(2).mean()
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(accelerator.reduce(loss.detach(), "mean")))
    first = next(model.parameters())
    local = first.to_local() if hasattr(first, "to_local") else first
    return {
        "backend": torch.distributed.get_backend(),
        "type": accelerator.distributed_type.value,
        "losses": losses,
        "shard_device": local.device.type,
        "weights": accelerator.get_state_dict(model),
    }


def test_fsdp_on_nccl_trains_as_ddp_does() -> None:
    ddp = notebook_launcher(train, (None,), 2, show_progress=False)
    fsdp = notebook_launcher(train, ({},), 2, show_progress=False)
    assert fsdp[0]["backend"] == "nccl" and fsdp[0]["type"] == "FSDP"
    assert fsdp[0]["shard_device"] == "cuda"
    torch.testing.assert_close(torch.tensor(fsdp[0]["losses"]), torch.tensor(ddp[0]["losses"]))
    for name, value in ddp[0]["weights"].items():
        torch.testing.assert_close(fsdp[0]["weights"][name].cpu(), value.cpu(), atol=1e-5, rtol=0)


def test_bf16_mixed_precision_policy_on_gpus() -> None:
    ddp = notebook_launcher(train, (None, "bf16"), 2, show_progress=False)
    fsdp = notebook_launcher(train, ({}, "bf16"), 2, show_progress=False)
    torch.testing.assert_close(
        torch.tensor(fsdp[0]["losses"]), torch.tensor(ddp[0]["losses"]), atol=2e-2, rtol=0
    )


def test_cpu_offload_keeps_the_shards_in_cpu_memory() -> None:
    plain = notebook_launcher(train, ({},), 2, show_progress=False)
    offloaded = notebook_launcher(train, ({"cpu_offload": True},), 2, show_progress=False)
    assert offloaded[0]["shard_device"] == "cpu"
    torch.testing.assert_close(
        torch.tensor(offloaded[0]["losses"]), torch.tensor(plain[0]["losses"]), atol=1e-5, rtol=0
    )
