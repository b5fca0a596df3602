"""Training through Accelerator on real worker groups equals the single-process computation."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from nb_accel import Accelerator, notebook_launcher
from nb_accel.utils import set_seed

SAMPLES, FEATURES = 64, 4


def make_data() -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, FEATURES, generator=generator)
    y = x @ torch.tensor([[1.5], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(
        SAMPLES, 1, generator=generator
    )
    return TensorDataset(x, y)


def train_regression(
    batch_size: int, accumulation: int, precision: str, epochs: int = 3
) -> dict[str, torch.Tensor]:
    """Train a linear regression; return the final parameters (same on every rank)."""
    set_seed(42)
    accelerator = Accelerator(gradient_accumulation_steps=accumulation, mixed_precision=precision)
    model = torch.nn.Linear(FEATURES, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100, gamma=0.5)
    loader = DataLoader(make_data(), batch_size=batch_size, shuffle=True)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    for _ in range(epochs):
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
    unwrapped = accelerator.unwrap_model(model)
    return {k: v.detach().clone() for k, v in unwrapped.state_dict().items()}


def _assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float) -> None:
    for key in a:
        assert torch.allclose(a[key], b[key], atol=atol), (key, a[key], b[key])


@pytest.mark.parametrize("precision, atol", [("no", 1e-5), ("bf16", 2e-2)], ids=["fp32", "bf16"])
def test_two_processes_equal_one_with_doubled_batch(precision: str, atol: float) -> None:
    [single] = notebook_launcher(train_regression, args=(16, 1, precision), num_processes=1)
    double = notebook_launcher(train_regression, args=(8, 1, precision), num_processes=2)
    _assert_close(double[0], double[1], 0.0)  # DDP keeps the ranks identical
    _assert_close(single, double[0], atol)
    assert not torch.allclose(single["weight"], torch.zeros_like(single["weight"]))


def test_gradient_accumulation_equals_the_large_batch() -> None:
    [single] = notebook_launcher(train_regression, args=(16, 1, "no"), num_processes=1)
    accumulated = notebook_launcher(train_regression, args=(4, 2, "no"), num_processes=2)
    _assert_close(single, accumulated[0], 1e-5)
    _assert_close(accumulated[0], accumulated[1], 0.0)


def accumulate_and_clip(clip: str, limit: float) -> dict[str, dict[str, list[float]]]:
    """One accumulate-and-clip loop (clipping on every batch) run twice: in full precision and
    through a real fp16 ``GradScaler`` (the CPU's, with fp32 forward passes). Returns, per run,
    the final parameters, the norm ``clip_grad_norm_`` returned on each batch and the largest
    gradient value after clipping."""
    accelerator = Accelerator(gradient_accumulation_steps=2)
    x_all, y_all = make_data().tensors
    rows = slice(32 * accelerator.process_index, 32 * (accelerator.process_index + 1))
    runs: dict[str, dict[str, list[float]]] = {}
    for name, scaler in (("fp32", None), ("fp16", torch.amp.GradScaler("cpu", init_scale=2.0**16))):
        accelerator.scaler = scaler
        set_seed(0)
        model = torch.nn.Linear(FEATURES, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = accelerator.prepare(model, optimizer)
        norms, peaks = [], []
        for x, y in zip(x_all[rows].split(4), y_all[rows].split(4), strict=True):
            with accelerator.accumulate(model):
                accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
                if clip == "norm":
                    norms.append(float(accelerator.clip_grad_norm_(model.parameters(), limit)))
                else:
                    accelerator.clip_grad_value_(model.parameters(), limit)
                peaks.append(max(p.grad.abs().max().item() for p in model.parameters()))
                optimizer.step()
                optimizer.zero_grad()
        params = torch.cat(
            [p.detach().flatten() for p in accelerator.unwrap_model(model).parameters()]
        )
        runs[name] = {"params": params.tolist(), "norms": norms, "peaks": peaks}
    return runs


@pytest.mark.parametrize(
    "clip, limit",
    [("norm", 10.0), ("norm", 0.5), ("value", 1.0)],
    ids=["norm-not-reached", "norm-clips", "value-clips"],
)
def test_fp16_clipping_on_every_accumulated_batch_equals_full_precision(
    clip: str, limit: float
) -> None:
    for runs in notebook_launcher(accumulate_and_clip, args=(clip, limit), num_processes=2):
        fp32, fp16 = torch.tensor(runs["fp32"]["params"]), torch.tensor(runs["fp16"]["params"])
        assert torch.allclose(fp16, fp32, atol=1e-6), (fp16, fp32)
        assert runs["fp16"]["norms"] == pytest.approx(runs["fp32"]["norms"], rel=1e-6)
        assert not torch.allclose(fp32, torch.zeros_like(fp32))
        # The limit is reached in the clipping cases only (the fp16 run's gradients are scaled).
        reached = max(runs["fp32"]["norms"] or runs["fp32"]["peaks"]) >= limit
        assert reached == (limit != 10.0)
