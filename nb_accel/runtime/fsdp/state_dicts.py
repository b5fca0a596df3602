"""State dicts of sharded models and their optimizers, through ``torch.distributed.checkpoint``:
whole (gathered to the main process, on the CPU) or sharded (each process its own part)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ..parallelism.tensor import quiet_redistribution

__all__ = [
    "full_model_state_dict",
    "model_of",
    "optimizer_state_dict",
    "set_model_state",
    "set_optimizer_state",
    "sharded_model_state_dict",
]


def _options(full: bool) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=full, cpu_offload=full)


def full_model_state_dict(model: torch.nn.Module) -> dict[str, Any]:
    """Collective: the whole weights of a sharded ``model`` on the main process (on the CPU),
    an empty dict on the others."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    with quiet_redistribution():  # tensor parallel shards: whole in two collectives
        return get_model_state_dict(model, options=_options(True))


def sharded_model_state_dict(model: torch.nn.Module) -> dict[str, Any]:
    """This process's shards of ``model``'s weights (``DTensor`` values)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_options(False))


def optimizer_state_dict(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, full: bool
) -> dict[str, Any]:
    """Collective: the optimizer's state keyed by parameter name; whole on the main process
    (``full``) or this process's shards."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=_options(full))


def set_model_state(model: torch.nn.Module, state: dict[str, Any], full: bool) -> None:
    """Load whole weights (``full``: every process passes them) or this process's shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=full))


def set_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any], full: bool
) -> None:
    """Load an optimizer state written by :func:`optimizer_state_dict`."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(
        model, optimizer, state, options=StateDictOptions(full_state_dict=full)
    )


def model_of(
    optimizer: torch.optim.Optimizer, models: Iterable[torch.nn.Module]
) -> torch.nn.Module | None:
    """The model whose parameters ``optimizer`` updates (the first that has any of them)."""
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for model in models:
        if any(id(p) in held for p in model.parameters()):
            return model
    return None
