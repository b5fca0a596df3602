"""fp16 mixed precision on the CPU: float16 autocast, a real CPU GradScaler, checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from nb_accel import Accelerator, notebook_launcher
from nb_accel.utils import GradScalerKwargs, set_seed


def _data() -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=generator)
    y = x @ torch.tensor([[1.5], [-2.0], [0.5], [3.0]])
    return TensorDataset(x, y)


def _prepared(accelerator: Accelerator) -> tuple[Any, Any, Any]:
    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(_data(), batch_size=8, shuffle=True)
    return accelerator.prepare(model, optimizer, loader)  # type: ignore[no-any-return]


def train_fp16_on_cpu() -> dict[str, Any]:
    accelerator = Accelerator(mixed_precision="fp16", cpu=True)
    model, optimizer, loader = _prepared(accelerator)
    inner_dtypes: set[torch.dtype] = set()
    model.module[0].register_forward_hook(lambda _m, _i, out: inner_dtypes.add(out.dtype))
    losses, norms_match, finite = [], [], 0
    for _ in range(6):
        for x, y in loader:
            out = model(x)
            loss = torch.nn.functional.mse_loss(out, y)
            accelerator.backward(loss)
            grads = [p.grad.clone() for p in model.parameters()]
            scale = accelerator.scaler.get_scale()
            norm = accelerator.clip_grad_norm_(model.parameters(), max_norm=1e6)
            expected = torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads])) / scale
            norms_match.append(bool(torch.isclose(norm, expected, rtol=1e-5, equal_nan=True)))
            finite += int(torch.isfinite(norm))
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    steady_skipped = accelerator.optimizer_step_was_skipped
    x, y = next(iter(loader))
    before = [p.detach().clone() for p in model.parameters()]
    scale_before = accelerator.scaler.get_scale()
    accelerator.backward(torch.nn.functional.mse_loss(model(x), y) * float("inf"))
    optimizer.step()
    optimizer.zero_grad()
    return {
        "scaler": type(accelerator.scaler).__name__,
        "scaler_is_grad_scaler": isinstance(accelerator.scaler, torch.amp.GradScaler),
        "scaler_device": accelerator.scaler._device,
        "inner_dtypes": sorted(str(d) for d in inner_dtypes),
        "output_dtype": str(out.dtype),
        "losses": losses,
        "norms_match": all(norms_match),
        "finite_steps": finite,
        "steady_skipped": steady_skipped,
        "inf_skipped": accelerator.optimizer_step_was_skipped,
        "unchanged": all(
            torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True)
        ),
        "scale_halved": accelerator.scaler.get_scale() == scale_before / 2,
    }


@pytest.mark.timeout(180)
def test_fp16_trains_on_the_cpu_with_autocast_and_a_grad_scaler() -> None:
    results = notebook_launcher(
        train_fp16_on_cpu, num_processes=2, mixed_precision="fp16", cpu=True
    )
    for result in results:
        assert result["scaler_is_grad_scaler"] and result["scaler_device"] == "cpu", result
        assert result["inner_dtypes"] == ["torch.float16"]  # the Linear ran in float16
        assert result["output_dtype"] == "torch.float32"  # handed back in float32
        losses = result["losses"]
        assert sum(losses[-4:]) < sum(losses[:4]) / 4, losses
        # clip_grad_norm_ returns the true (unscaled) norm; the first steps overflow in float16
        # (the scale starts at 2**16) and are skipped while the scaler lowers its scale.
        assert result["norms_match"] and result["finite_steps"] >= 16, result
        assert result["steady_skipped"] is False
        assert result["inf_skipped"] is True
        assert result["unchanged"] and result["scale_halved"]


def save_with_a_lowered_scale(folder: str) -> float:
    accelerator = Accelerator(mixed_precision="fp16", cpu=True)
    model, optimizer, loader = _prepared(accelerator)
    x, y = next(iter(loader))
    accelerator.backward(torch.nn.functional.mse_loss(model(x), y) * float("inf"))
    optimizer.step()  # skipped: the scale halves
    optimizer.zero_grad()
    accelerator.save_state(folder)
    return float(accelerator.scaler.get_scale())


def load_scale(folder: str) -> tuple[float, float]:
    accelerator = Accelerator(mixed_precision="fp16", cpu=True)
    _prepared(accelerator)
    fresh = float(accelerator.scaler.get_scale())
    accelerator.load_state(folder)
    return fresh, float(accelerator.scaler.get_scale())


@pytest.mark.timeout(180)
def test_save_state_and_load_state_keep_the_cpu_loss_scale(tmp_path: Path) -> None:
    folder = str(tmp_path / "state")
    saved = notebook_launcher(
        save_with_a_lowered_scale, (folder,), num_processes=2, mixed_precision="fp16", cpu=True
    )
    assert saved == [2.0**15, 2.0**15]
    assert (tmp_path / "state" / "scaler.pt").is_file()
    loaded = notebook_launcher(
        load_scale, (folder,), num_processes=2, mixed_precision="fp16", cpu=True
    )
    assert loaded == [(2.0**16, 2.0**15), (2.0**16, 2.0**15)]


def accumulate_and_clip(clip: str, limit: float, precision: str) -> list[float]:
    """Eight batches per rank, two per optimizer step, clipping on every batch; the final
    parameters. The loss scale starts low enough that no step overflows in float16."""
    set_seed(0)
    accelerator = Accelerator(
        gradient_accumulation_steps=2,
        mixed_precision=precision,
        cpu=True,
        kwargs_handlers=[GradScalerKwargs(init_scale=2.0**8)],
    )
    x_all, y_all = _data().tensors
    rows = slice(32 * accelerator.process_index, 32 * (accelerator.process_index + 1))
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    for x, y in zip(x_all[rows].split(4), y_all[rows].split(4), strict=True):
        with accelerator.accumulate(model):
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            if clip == "norm":
                accelerator.clip_grad_norm_(model.parameters(), limit)
            else:
                accelerator.clip_grad_value_(model.parameters(), limit)
            optimizer.step()
            assert not accelerator.optimizer_step_was_skipped
            optimizer.zero_grad()
    params = [p.detach().flatten() for p in accelerator.unwrap_model(model).parameters()]
    return torch.cat(params).tolist()


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "clip, limit",
    [("norm", 10.0), ("norm", 0.5), ("value", 1.0)],
    ids=["norm-not-reached", "norm-clips", "value-clips"],
)
def test_fp16_accumulate_and_clip_on_the_cpu_matches_fp32(clip: str, limit: float) -> None:
    runs = {
        precision: notebook_launcher(
            accumulate_and_clip, (clip, limit, precision), num_processes=2, cpu=True
        )[0]
        for precision in ("fp16", "no")
    }
    # float16 rounds the forward pass; gradients clipped while still scaled (or clipped once
    # unscaled by the wrong factor) would differ wholesale.
    fp16, fp32 = torch.tensor(runs["fp16"]), torch.tensor(runs["no"])
    assert torch.allclose(fp16, fp32, atol=2e-2), (fp16, fp32)
    assert not torch.equal(fp16, fp32)  # float16 did run
