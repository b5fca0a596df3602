"""Training on the XLA device: prepare, steps, clipping, scheduler, loader, collectives."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

pytest.importorskip("torch_xla")

import torch
from torch.utils.data import DataLoader, TensorDataset

from nb_accel import Accelerator, notebook_launcher, set_seed


def _problem() -> tuple[torch.nn.Module, torch.optim.Optimizer, DataLoader, Any]:  # type: ignore[type-arg]
    set_seed(0)
    x = torch.randn(64, 4)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=8, gamma=0.5)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    return model, optimizer, loader, scheduler


def train(epochs: int, accumulation: int) -> dict[str, Any]:
    accelerator = Accelerator(gradient_accumulation_steps=accumulation)
    model, optimizer, loader, scheduler = accelerator.prepare(*_problem())
    params = list(model.parameters())
    before = [p.detach().cpu().clone() for p in params]
    losses, devices = [], set()
    for _ in range(epochs):
        total = torch.zeros((), device=accelerator.device)
        for x, y in loader:
            devices.add(x.device.type)
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                accelerator.clip_grad_norm_(model.parameters(), 5.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            total += loss.detach()
        losses.append(float(accelerator.reduce(total, "sum")) / len(loader))
    owned = {id(p) for p in model.parameters()}
    return {
        "losses": losses,
        "devices": sorted(devices),
        "loader": type(loader).__name__,
        "changed": any(
            not torch.equal(a, b.detach().cpu()) for a, b in zip(before, params, strict=True)
        ),
        "optimizer_follows_model": all(
            id(p) in owned for group in optimizer.param_groups for p in group["params"]
        ),
        "lr": scheduler.get_last_lr()[0],
    }


@pytest.mark.parametrize("accumulation", [1, 2])
def test_training_steps_decrease_the_loss(accumulation: int) -> None:
    result = notebook_launcher(train, args=(6, accumulation), show_progress=False)[0]
    assert result["devices"] == ["xla"]
    assert result["loader"] == "XlaDataLoaderShard"
    assert result["optimizer_follows_model"]
    assert result["changed"]
    losses = result["losses"]
    assert all(later < earlier for earlier, later in itertools.pairwise(losses)), losses
    assert losses[-1] < losses[0] * 0.6, losses
    steps = 6 * 4 // accumulation  # optimizer steps: the scheduler follows them
    assert result["lr"] == pytest.approx(0.05 * 0.5 ** (steps // 8))


def collectives() -> dict[str, Any]:
    accelerator = Accelerator()
    device = accelerator.device
    row = torch.tensor([[1.0, 2.0]], device=device)
    results: dict[str, Any] = {
        "gather": accelerator.gather(row),
        "gather_scalar": accelerator.gather(torch.tensor(5.0, device=device)),
        "gather_cpu": accelerator.gather(torch.tensor([7])),
        "sum": accelerator.reduce(torch.tensor([2.0, 4.0], device=device), "sum"),
        "mean": accelerator.reduce(torch.tensor([2.0, 4.0], device=device), "mean"),
        "max": accelerator.reduce(torch.tensor([2.0, 4.0], device=device), "max", scale=2.0),
        "broadcast": accelerator.broadcast(torch.tensor([9.0, 8.0], device=device)),
        "padded": accelerator.pad_across_processes(torch.ones(3, device=device)),
        "objects": accelerator.gather_object([{"rank": accelerator.process_index}]),
        "tree": accelerator.gather({"a": row, "b": [row * 2]}),
    }
    accelerator.wait_for_everyone()
    with accelerator.main_process_first():
        results["first"] = True
    accelerator.set_trigger()
    results["trigger"] = accelerator.check_trigger()
    results["trigger_reset"] = accelerator.check_trigger()
    return results


def test_collectives_go_through_xm() -> None:
    result = notebook_launcher(collectives, show_progress=False)[0]
    assert torch.equal(result["gather"], torch.tensor([[1.0, 2.0]]))
    assert torch.equal(result["gather_scalar"], torch.tensor([5.0]))
    assert torch.equal(result["gather_cpu"], torch.tensor([7]))
    assert torch.equal(result["sum"], torch.tensor([2.0, 4.0]))
    assert torch.equal(result["mean"], torch.tensor([2.0, 4.0]))
    assert torch.equal(result["max"], torch.tensor([4.0, 8.0]))
    assert torch.equal(result["broadcast"], torch.tensor([9.0, 8.0]))
    assert torch.equal(result["padded"], torch.ones(3))
    assert result["objects"] == [{"rank": 0}]
    assert torch.equal(result["tree"]["b"][0], torch.tensor([[2.0, 4.0]]))
    assert result["first"] and result["trigger"] and not result["trigger_reset"]


def evaluate() -> dict[str, Any]:
    accelerator = Accelerator()
    model, _, _, _ = _problem()
    loader = DataLoader(TensorDataset(torch.arange(10.0)[:, None]), batch_size=4)
    model, loader = accelerator.prepare(model, loader)
    seen = [accelerator.gather_for_metrics(batch) for (batch,) in loader]
    resumed = accelerator.skip_first_batches(loader, 1)
    with accelerator.autocast():
        output = model(torch.ones(2, 4, device=accelerator.device))
    return {
        "seen": torch.cat(seen),
        "dtype": output.dtype,
        "resumed": (type(resumed).__name__, torch.cat([batch for (batch,) in resumed])),
    }


def test_evaluation_loop_and_bf16() -> None:
    result = notebook_launcher(evaluate, mixed_precision="bf16", show_progress=False)[0]
    assert torch.equal(result["seen"], torch.arange(10.0)[:, None])
    assert result["dtype"] == torch.float32  # prepared models return fp32 outputs
    kind, rest = result["resumed"]
    assert kind == "XlaDataLoaderShard"
    assert torch.equal(rest, torch.arange(4.0, 10.0)[:, None])


def _draws_after_seeding() -> bool:
    device = Accelerator().device
    set_seed(3)
    first = torch.rand(8, device=device).cpu()
    set_seed(3)
    second = torch.rand(8, device=device).cpu()
    return bool(torch.equal(first, second)) and device.type == "xla"


@pytest.mark.timeout(120)
def test_set_seed_seeds_the_xla_generator() -> None:
    assert notebook_launcher(_draws_after_seeding, num_processes=1) == [True]
