"""Several GPUs (skipped with fewer than two): DDP on two GPUs trains as one process does on the
whole batch, and each rank's CUDA random state comes back from a checkpoint as its own."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nb_accel import Accelerator, notebook_launcher
from nb_accel.runtime.device_types import cuda_facts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(cuda_facts.cuda_device_count() < 2, reason="needs two CUDA GPUs"),
]


def train(steps: int) -> list[torch.Tensor]:
    """SGD on a fixed data set of 32 rows, batch 16 per process in all: the same updates
    whatever the number of processes when the batches are split evenly."""
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    accelerator = Accelerator()
    data = TensorDataset(torch.randn(32, 8), torch.randn(32, 1))
    per_process = 16 // accelerator.num_processes
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(data, batch_size=per_process)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for _ in range(steps):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    return [p.detach().cpu() for p in accelerator.unwrap_model(model).parameters()]


@pytest.mark.timeout(300)
def test_two_gpus_train_as_one_process_on_the_whole_batch() -> None:
    [alone] = notebook_launcher(train, args=(3,), num_processes=1)
    first, second = notebook_launcher(train, args=(3,), num_processes=2)
    for a, b, c in zip(alone, first, second, strict=True):
        torch.testing.assert_close(b, c)  # the ranks agree
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)  # and match one process


def save_then_draw(folder: str) -> torch.Tensor:
    accelerator = Accelerator()
    torch.cuda.manual_seed(100 + accelerator.process_index)  # a different stream per rank
    accelerator.save_state(folder)
    return torch.rand(4, device=accelerator.device).cpu()


def load_then_draw(folder: str) -> torch.Tensor:
    accelerator = Accelerator()
    torch.cuda.manual_seed(7)  # overwritten by the checkpoint
    accelerator.load_state(folder)
    return torch.rand(4, device=accelerator.device).cpu()


@pytest.mark.timeout(300)
def test_each_rank_gets_its_own_cuda_random_state_back(tmp_path: Path) -> None:
    folder = str(tmp_path / "state")
    saved = notebook_launcher(save_then_draw, args=(folder,), num_processes=2)
    loaded = notebook_launcher(load_then_draw, args=(folder,), num_processes=2)
    assert not torch.equal(saved[0], saved[1])
    for before, after in zip(saved, loaded, strict=True):
        assert torch.equal(before, after)
