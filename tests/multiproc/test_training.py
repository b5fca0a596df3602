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
