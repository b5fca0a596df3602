"""The state dicts of a model each process holds a part of (``DTensor`` parameters: sharded by
FSDP2, split by tensor parallelism), through ``torch.distributed.checkpoint``: whole (gathered
to the main process) or this process's parts, its optimizer's state keyed by parameter name. A
strategy says which models are held in parts; the others keep their own state dicts."""

from __future__ import annotations

import abc
from typing import Any

import torch

from ..fsdp.state_dicts import (
    full_model_state_dict,
    optimizer_state_dict,
    set_model_state,
    set_optimizer_state,
    sharded_model_state_dict,
)

__all__ = ["StateDictsInParts"]


class StateDictsInParts(abc.ABC):
    """Mixin of a sharding strategy: the state dict methods of
    :class:`~nb_accel.runtime.sharding.strategy.ShardingStrategy` for the models
    :meth:`is_sharded` says are held in parts."""

    @abc.abstractmethod
    def is_sharded(self, model: torch.nn.Module) -> bool:
        """True when each process holds only its part of ``model``'s weights."""

    def model_state_dict(self, model: torch.nn.Module, full: bool = True) -> dict[str, Any]:
        """Whole (a collective that fills the main process's, on the CPU) or this process's
        parts, for a model held in parts; any other model's own."""
        if not self.is_sharded(model):
            return model.state_dict()
        return full_model_state_dict(model) if full else sharded_model_state_dict(model)

    def load_model_state_dict(
        self, model: torch.nn.Module, state: dict[str, Any], full: bool = True
    ) -> None:
        """Whole weights (every process passes them) or this process's parts."""
        if self.is_sharded(model):
            set_model_state(model, state, full=full)
        else:
            model.load_state_dict(state)

    def optimizer_state_dict(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, full: bool = True
    ) -> dict[str, Any]:
        """For a model held in parts, keyed by parameter name: whole on the main process
        (``full``) or these parts; any other's own."""
        if not self.is_sharded(model):
            return optimizer.state_dict()
        return optimizer_state_dict(model, optimizer, full=full)

    def load_optimizer_state_dict(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        state: dict[str, Any],
        full: bool = True,
    ) -> None:
        """Load what :meth:`optimizer_state_dict` gave."""
        if self.is_sharded(model):
            set_optimizer_state(model, optimizer, state, full=full)
        else:
            optimizer.load_state_dict(state)
