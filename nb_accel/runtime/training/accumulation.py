"""Gradient accumulation: which steps synchronise gradients, and skipping the sharding
strategy's gradient sync (DDP's all-reduce, FSDP's reduce-scatter) on the others."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from ..sharding.registry import no_sync
from ..state import GradientState

__all__ = ["GradientAccumulator"]


class GradientAccumulator:
    """Counts batches and decides, per batch, whether this is a synchronising step.

    A step synchronises every ``num_steps`` batches, and always on the last batch of the data
    loader being iterated (when ``sync_with_dataloader``), so no gradients are left behind at
    the end of an epoch.
    """

    def __init__(self, gradient_state: GradientState, sync_each_batch: bool = False) -> None:
        self.gradient_state = gradient_state
        self.sync_each_batch = sync_each_batch
        self.step = 0

    def advance(self) -> None:
        """Count one batch and set ``gradient_state.sync_gradients`` for it."""
        state = self.gradient_state
        if state.sync_with_dataloader and state.end_of_dataloader:
            self.step = 0
            state._set_sync_gradients(True)
        else:
            self.step += 1
            state._set_sync_gradients(self.step % state.num_steps == 0)

    @contextlib.contextmanager
    def accumulate(self, *models: torch.nn.Module) -> Iterator[None]:
        """One batch of accumulation: the gradients of ``models`` synchronised (as the
        strategy that prepared them does) only on synchronising steps."""
        self.advance()
        with contextlib.ExitStack() as stack:
            if not self.gradient_state.sync_gradients and not self.sync_each_batch:
                for model in models:
                    stack.enter_context(no_sync(model))
            yield
