"""A training run written as Accelerate documents resuming: checkpoints every few steps with
automatic names, and on a restart the newest one loaded and the epoch's seen batches skipped.
Used by the restart tests and ``benchmarks/recover.py``.

Rank ``kill_rank`` is killed (SIGKILL, as the out-of-memory killer does) after step
``kill_at`` of the first attempt; under ``max_restarts`` torch's elastic agent starts every
rank again and the run resumes from its newest checkpoint.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from nb_accel import Accelerator, ProjectConfiguration
from nb_accel.utils import set_seed

#: Samples in the dataset (each rank sees half of them per epoch).
SAMPLES = 64
BATCH_SIZE = 4


class Progress:
    """The optimizer steps taken, saved with the checkpoints."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step = state["step"]


def train(
    project_dir: str,
    epochs: int = 4,
    every: int = 5,
    kill_at: int | None = None,
    kill_rank: int = 1,
) -> tuple[int, dict[str, torch.Tensor]]:
    """Train a small model with dropout on shuffled data; the steps taken and the final
    weights. A checkpoint every ``every`` steps; see the module for ``kill_at``."""
    set_seed(0)
    features = torch.randn(SAMPLES, 8)
    targets = features @ torch.randn(8, 1) + 0.1 * torch.randn(SAMPLES, 1)
    loader = DataLoader(TensorDataset(features, targets), batch_size=BATCH_SIZE, shuffle=True)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.8)

    config = ProjectConfiguration(project_dir=project_dir, automatic_checkpoint_naming=True)
    accelerator = Accelerator(project_config=config)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    if restarted and any(Path(project_dir, "checkpoints").glob("checkpoint_*")):
        accelerator.load_state()  # the newest checkpoint
    total = epochs * len(loader)
    while progress.step < total:
        skip = progress.step % len(loader)  # the batches this epoch gave before the checkpoint
        for inputs, wanted in accelerator.skip_first_batches(loader, skip) if skip else loader:
            loss = nn.functional.mse_loss(model(inputs), wanted)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            progress.step += 1
            if progress.step % every == 0:
                accelerator.save_state()
            if (
                progress.step == kill_at
                and not restarted
                and accelerator.process_index == kill_rank
            ):
                os.kill(os.getpid(), signal.SIGKILL)
    weights = accelerator.unwrap_model(model).state_dict()
    return progress.step, {name: value.detach().clone() for name, value in weights.items()}
