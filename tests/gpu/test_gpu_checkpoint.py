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


def device_map_load(folder: str) -> dict[str, object]:
    """In a worker (this pytest process never initialises CUDA): save from the GPU, load with a
    device map that sends one prefix to GPU 0 and the rest to the CPU."""
    from nb_accel.runtime.checkpoint.model_io import load_checkpoint_in_model, save_model_files

    torch.manual_seed(26)
    source = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    save_model_files(source.to("cuda").state_dict(), Path(folder))
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    load_checkpoint_in_model(fresh, Path(folder), device_map={"0": 0, "": "cpu"}, strict=True)
    return {
        "first": str(fresh[0].weight.device),
        "second": str(fresh[1].weight.device),
        "same": torch.equal(fresh[0].weight, source[0].weight),
    }


def test_device_map_sends_prefixes_to_cuda(tmp_path: Path) -> None:
    [loaded] = notebook_launcher(device_map_load, args=(str(tmp_path),), num_processes=1)
    assert loaded == {"first": "cuda:0", "second": "cpu", "same": True}
