"""Mixed precision on a GPU (skipped without CUDA): fp16 with GradScaler, bf16, skipped steps."""

from __future__ import annotations

import pytest
import torch

from nb_accel import Accelerator, notebook_launcher
from nb_accel.runtime.device_types import cuda_facts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(cuda_facts.cuda_device_count() == 0, reason="needs a CUDA GPU"),
]


def fp16_training() -> dict[str, object]:
    accelerator = Accelerator()
    model = torch.nn.Sequential(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    x = torch.randn(16, 8, device=accelerator.device)
    dtypes, losses = [], []
    model[0].register_forward_hook(lambda m, i, o: dtypes.append(str(o.dtype)))
    for _ in range(5):
        loss = (model(x) ** 2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    # An infinite loss makes the scaler skip the step, and the Accelerator says so.
    accelerator.backward(model(x).sum() * float("inf"))
    optimizer.step()
    optimizer.zero_grad()
    return {
        "scaler": type(accelerator.scaler).__name__,
        "inner_dtype": dtypes[0],
        "losses": losses,
        "skipped": accelerator.optimizer_step_was_skipped,
        "device": str(accelerator.device),
    }


def test_fp16_uses_a_grad_scaler_and_detects_skipped_steps() -> None:
    [result] = notebook_launcher(fp16_training, num_processes=1, mixed_precision="fp16")
    assert result["scaler"] == "GradScaler" and result["device"] == "cuda:0"
    assert result["inner_dtype"] == "torch.float16"
    assert result["losses"][-1] < result["losses"][0]
    assert result["skipped"] is True


def bf16_dtypes() -> tuple[str, str]:
    accelerator = Accelerator(mixed_precision="bf16")
    model = accelerator.prepare(torch.nn.Sequential(torch.nn.Linear(8, 8)))
    inner: list[str] = []
    accelerator.unwrap_model(model)[0].register_forward_hook(
        lambda m, i, o: inner.append(str(o.dtype))
    )
    out = model(torch.randn(4, 8, device=accelerator.device))
    return inner[0], str(out.dtype)


def test_bf16_autocast_on_gpu() -> None:
    [(inner, outer)] = notebook_launcher(bf16_dtypes, num_processes=1, mixed_precision="bf16")
    assert inner == "torch.bfloat16" and outer == "torch.float32"
