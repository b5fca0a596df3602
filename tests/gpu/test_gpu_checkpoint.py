"""Checkpoints on a GPU (skipped without CUDA): the fp16 GradScaler and CUDA random states."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nb_accel import Accelerator, notebook_launcher
from nb_accel.runtime.device_types import cuda_facts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(cuda_facts.cuda_device_count() == 0, reason="needs a CUDA GPU"),
]


def fp16_round_trip(folder: str) -> dict[str, object]:
    accelerator = Accelerator()
    model = torch.nn.Sequential(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    x = torch.randn(16, 8, device=accelerator.device)
    for _ in range(3):
        accelerator.backward((model(x) ** 2).mean())
        optimizer.step()
        optimizer.zero_grad()
    assert accelerator.scaler is not None
    accelerator.scaler.update(1234.0)  # a scale no fresh scaler has
    accelerator.save_state(folder)
    expected = torch.rand(4, device=accelerator.device)  # the CUDA generator after saving
    return {"expected": expected.cpu()}


def fp16_load(folder: str) -> dict[str, object]:
    accelerator = Accelerator()
    model = torch.nn.Sequential(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    accelerator.prepare(model, optimizer)
    accelerator.load_state(folder)
    assert accelerator.scaler is not None
    return {"scale": accelerator.scaler.get_scale(), "drawn": torch.rand(4, device="cuda").cpu()}


def test_the_grad_scaler_and_cuda_random_states_come_back(tmp_path: Path) -> None:
    folder = str(tmp_path / "ckpt")
    [saved] = notebook_launcher(
        fp16_round_trip, args=(folder,), num_processes=1, mixed_precision="fp16"
    )
    [loaded] = notebook_launcher(fp16_load, args=(folder,), num_processes=1, mixed_precision="fp16")
    assert (Path(folder) / "scaler.pt").is_file()
    assert loaded["scale"] == 1234.0
    assert torch.equal(loaded["drawn"], saved["expected"])
