"""A small model and data shared by the FSDP tests: residual blocks, each its own FSDP unit."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

WIDTH = 24
SAMPLES = 96


class Block(nn.Module):
    """A residual MLP block with a layer norm (a transformer block without attention); it
    counts its forward passes (a recompute under activation checkpointing is one more)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, 2 * WIDTH)
        self.down = nn.Linear(2 * WIDTH, WIDTH)
        self.forward_calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.forward_calls += 1
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def forward_calls(model: nn.Module) -> int:
    """The forward passes of every :class:`Block` in ``model`` so far."""
    return sum(m.forward_calls for m in model.modules() if isinstance(m, Block))


class Net(nn.Module):
    """An input layer, three blocks and a head (odd sizes, so shards are uneven on 3 ranks)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(7, WIDTH)
        self.blocks = nn.Sequential(Block(), Block(), Block())
        self.head = nn.Linear(WIDTH, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(x)))


def dataset() -> TensorDataset:
    """Fixed inputs and regression targets."""
    generator = torch.Generator().manual_seed(11)
    x = torch.randn(SAMPLES, 7, generator=generator)
    y = torch.randn(SAMPLES, 3, generator=generator)
    return TensorDataset(x, y)


def loader(batch_size: int = 4, shuffle: bool = False) -> DataLoader:  # type: ignore[type-arg]
    """The training loader (before prepare)."""
    return DataLoader(dataset(), batch_size=batch_size, shuffle=shuffle)


def local_numel(tensor: torch.Tensor) -> int:
    """Elements this process holds of ``tensor`` (its shard for a DTensor)."""
    from torch.distributed.tensor import DTensor

    return (tensor.to_local() if isinstance(tensor, DTensor) else tensor).numel()
