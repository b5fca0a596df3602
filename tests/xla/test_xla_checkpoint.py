"""save_state / load_state on XLA: written through the CPU, restored exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch_xla")

import torch
from torch.utils.data import DataLoader, TensorDataset

from nb_accel import (
    Accelerator,
    load_checkpoint_in_model,
    notebook_launcher,
    set_seed,
)


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.ReLU(), torch.nn.Linear(8, 1)
    )


def _snapshot(model: torch.nn.Module, optimizer: Any, scheduler: Any) -> dict[str, Any]:
    state = optimizer.state_dict()["state"]
    return {
        "params": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
        "optimizer": {
            (key, name): value.detach().cpu().clone()
            for key, slots in state.items()
            for name, value in slots.items()
            if isinstance(value, torch.Tensor)
        },
        "lr": scheduler.get_last_lr(),
    }


def round_trip(folder: str) -> dict[str, Any]:
    set_seed(1)
    accelerator = Accelerator()
    x = torch.randn(48, 4)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True))
    model = _model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.9)
    loader = DataLoader(data, batch_size=12, shuffle=True)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    def epoch() -> None:
        for inputs, targets in loader:
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()

    epoch()
    saved_at = accelerator.save_state(folder)
    saved = _snapshot(model, optimizer, scheduler)
    epoch()
    continued = _snapshot(model, optimizer, scheduler)
    accelerator.load_state(folder)
    loaded = _snapshot(model, optimizer, scheduler)
    epoch()
    replayed = _snapshot(model, optimizer, scheduler)
    accelerator.wait_for_everyone()
    accelerator.save_model(model, str(Path(folder).parent / "exported"))
    accelerator.save({"w": model[0].weight}, str(Path(folder).parent / "weight.pt"))
    return {
        "folder": saved_at,
        "saved": saved,
        "continued": continued,
        "loaded": loaded,
        "replayed": replayed,
        "final": continued["params"],
    }


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    parts = ("params", "optimizer")
    return a["lr"] == b["lr"] and all(
        torch.equal(a[part][key], b[part][key]) for part in parts for key in a[part]
    )


def test_save_and_load_state_restore_identical_parameters(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoint"
    result = notebook_launcher(round_trip, args=(str(folder),), show_progress=False)[0]
    assert result["folder"] == str(folder)
    files = {path.name for path in folder.iterdir()}
    assert {"model.safetensors", "optimizer.bin", "scheduler.bin"} <= files
    assert {"random_states_0.pkl", "xla_random_state_0.pt"} <= files
    assert not _same(result["saved"], result["continued"])  # training went on after saving
    assert _same(result["loaded"], result["saved"])  # load_state put everything back
    assert _same(result["replayed"], result["continued"])  # and the same epoch followed
    exported = _model()
    load_checkpoint_in_model(exported, str(tmp_path / "exported"))
    for name, value in exported.state_dict().items():
        assert torch.equal(value, result["replayed"]["params"][name])
    saved_weight = torch.load(tmp_path / "weight.pt", weights_only=True)["w"]
    assert saved_weight.device.type == "cpu"
    assert torch.equal(saved_weight, result["replayed"]["params"]["0.weight"])
