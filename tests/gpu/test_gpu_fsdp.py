"""FSDP2 on GPUs with NCCL (skipped without two CUDA GPUs): the same training as DDP, a bf16
mixed precision policy, CPU offload of the shards (clipped every step: the norm of offloaded
gradients is a collective on CPU tensors, which the FSDP launch's 'cuda:nccl,cpu:gloo' group
runs on gloo) and activation checkpointing with its offload."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nb_accel import Accelerator, FullyShardedDataParallelPlugin, notebook_launcher
from nb_accel.runtime.device_types import cuda_facts

MAPPED = "cuda:nccl,cpu:gloo"

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(300),
    pytest.mark.skipif(cuda_facts.cuda_device_count() < 2, reason="needs two CUDA GPUs"),
]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 64), torch.nn.Linear(64, 4)
    )


#: Each Linear its own unit (activation checkpointing needs units below the model).
BY_LINEAR = {
    "auto_wrap_policy": "transformer_based_wrap",
    "transformer_cls_names_to_wrap": ["Linear"],
}


def train(plugin_options: dict[str, Any] | None, mixed_precision: str = "no") -> dict[str, Any]:
    plugin = None if plugin_options is None else FullyShardedDataParallelPlugin(**plugin_options)
    accelerator = Accelerator(fsdp_plugin=plugin, mixed_precision=mixed_precision)
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    generator = torch.Generator().manual_seed(accelerator.process_index)
    losses, norms = [], []
    for _ in range(8):
        x = torch.randn(16, 32, generator=generator).to(accelerator.device)
        loss = model(x).float().pow(2).mean()
        accelerator.backward(loss)
        norms.append(float(accelerator.clip_grad_norm_(model.parameters(), 0.01)))
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(accelerator.reduce(loss.detach(), "mean")))
    first = next(model.parameters())
    local = first.to_local() if hasattr(first, "to_local") else first
    return {
        "backend": torch.distributed.get_backend(),
        "type": accelerator.distributed_type.value,
        "losses": losses,
        "norms": norms,
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


def _close(a: list[float], b: list[float], atol: float = 1e-5) -> None:
    torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=atol, rtol=0)


def test_cpu_offload_keeps_the_shards_in_cpu_memory_and_clips_every_step() -> None:
    plain = notebook_launcher(train, ({},), 2, show_progress=False, fsdp=True)
    offloaded = notebook_launcher(
        train, ({"cpu_offload": True},), 2, show_progress=False, fsdp=True
    )
    assert plain[0]["backend"] == offloaded[0]["backend"] == MAPPED
    assert plain[0]["shard_device"] == "cuda" and offloaded[0]["shard_device"] == "cpu"
    assert all(norm > 0.01 for norm in offloaded[0]["norms"])  # every step clipped
    assert offloaded[0]["norms"] == offloaded[1]["norms"]  # one norm, the same on every rank
    _close(offloaded[0]["norms"], plain[0]["norms"])
    _close(offloaded[0]["losses"], plain[0]["losses"])
    for name, value in plain[0]["weights"].items():  # whole state dicts of CPU shards too
        torch.testing.assert_close(
            offloaded[0]["weights"][name].cpu(), value.cpu(), atol=1e-5, rtol=0
        )


def test_offload_asked_in_the_kernels_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FSDP_OFFLOAD_PARAMS", "true")  # read by the plugin the function makes
    offloaded = notebook_launcher(train, ({},), 2, show_progress=False)  # a DDP launch
    assert offloaded[0]["backend"] == MAPPED and offloaded[0]["shard_device"] == "cpu"


def test_offload_in_a_launch_whose_group_is_nccl_alone_is_refused() -> None:
    with pytest.raises(ValueError, match=r"runs 'nccl' only.*fsdp=True"):
        notebook_launcher(train, ({"cpu_offload": True},), 2, show_progress=False)


def test_activation_checkpointing_and_its_offload_on_gpus() -> None:
    plain = notebook_launcher(train, (BY_LINEAR,), 2, show_progress=False, fsdp=True)
    checkpointed = {**BY_LINEAR, "activation_checkpointing": True}
    offloaded = {**checkpointed, "activation_checkpointing_offload": True}
    for options in (checkpointed, offloaded):
        result = notebook_launcher(train, (options,), 2, show_progress=False, fsdp=True)
        _close(result[0]["losses"], plain[0]["losses"])
        _close(result[0]["norms"], plain[0]["norms"])
