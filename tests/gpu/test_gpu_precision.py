"""fp16 on a GPU (skipped without CUDA): clipping inside gradient accumulation is exact on every
batch, so an accumulate-and-clip loop under fp16 ends where the same loop in fp32 ends.

The loss scale starts at 1024, not GradScaler's 65536: at that scale this model's first
gradients overflow fp16 and GradScaler skips those steps (as it does under Accelerate), which
would make the runs differ for a reason that has nothing to do with clipping."""

from __future__ import annotations

import pytest
import torch

from nb_accel import Accelerator, notebook_launcher
from nb_accel.runtime.device_types import cuda_facts
from nb_accel.utils import GradScalerKwargs, set_seed

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(cuda_facts.cuda_device_count() == 0, reason="needs a CUDA GPU"),
]


def accumulate_and_clip(clip: str, limit: float) -> tuple[list[float], int]:
    """Eight batches, two per optimizer step, clipping on every batch; the final parameters
    and the number of optimizer steps skipped."""
    set_seed(0)
    accelerator = Accelerator(
        gradient_accumulation_steps=2, kwargs_handlers=[GradScalerKwargs(init_scale=1024)]
    )
    generator = torch.Generator().manual_seed(0)
    x_all = torch.randn(32, 4, generator=generator).to(accelerator.device)
    y_all = x_all @ torch.tensor([[1.5], [-2.0], [0.5], [3.0]], device=accelerator.device)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    skipped = 0
    for x, y in zip(x_all.split(4), y_all.split(4), strict=True):
        with accelerator.accumulate(model):
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            if clip == "norm":
                accelerator.clip_grad_norm_(model.parameters(), limit)
            else:
                accelerator.clip_grad_value_(model.parameters(), limit)
            optimizer.step()
            skipped += accelerator.sync_gradients and accelerator.optimizer_step_was_skipped
            optimizer.zero_grad()
    params = [p.detach().flatten() for p in accelerator.unwrap_model(model).parameters()]
    return torch.cat(params).cpu().tolist(), skipped


@pytest.mark.parametrize(
    "clip, limit",
    [("norm", 10.0), ("norm", 0.5), ("value", 1.0)],
    ids=["norm-not-reached", "norm-clips", "value-clips"],
)
def test_fp16_accumulate_and_clip_on_every_batch_matches_fp32(clip: str, limit: float) -> None:
    [(fp16, skipped)] = notebook_launcher(
        accumulate_and_clip, args=(clip, limit), num_processes=1, mixed_precision="fp16"
    )
    [(fp32, _)] = notebook_launcher(
        accumulate_and_clip, args=(clip, limit), num_processes=1, mixed_precision="no"
    )
    assert skipped == 0
    # fp16 rounds the forward pass; gradients clipped while still scaled would differ wholesale.
    assert torch.allclose(torch.tensor(fp16), torch.tensor(fp32), atol=2e-2), (fp16, fp32)
    assert not torch.cuda.is_initialized()  # the launcher never touched CUDA in this process
