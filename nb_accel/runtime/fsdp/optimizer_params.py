"""Moving an optimizer built over a model's original parameters onto the model's shards."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import torch

from .sharding import ShardedModel

__all__ = ["check_not_prepared_before", "move_onto_shards"]


def move_onto_shards(optimizer: torch.optim.Optimizer, sharded: Iterable[ShardedModel]) -> int:
    """Replace, in ``optimizer``'s parameter groups and state, every original parameter of a
    sharded model by its shard; returns how many were replaced."""
    models = list(sharded)

    def shard_of(parameter: torch.Tensor) -> torch.Tensor:
        for model in models:
            found = model.sharded(parameter)  # type: ignore[arg-type]
            if found is not None:
                return found
        return parameter

    replaced = 0
    for group in optimizer.param_groups:
        new = [shard_of(p) for p in group["params"]]
        replaced += sum(a is not b for a, b in zip(group["params"], new, strict=True))
        group["params"] = new
    if replaced and optimizer.state:
        optimizer.state = defaultdict(dict, {shard_of(k): v for k, v in optimizer.state.items()})
    return replaced


def check_not_prepared_before(
    model: torch.nn.Module, optimizers: Iterable[torch.optim.Optimizer]
) -> None:
    """Raise when an optimizer prepared earlier updates ``model``'s parameters, which FSDP is
    about to replace by shards: that optimizer would go on updating the old full copies."""
    own = {id(p) for p in model.parameters()}
    for optimizer in optimizers:
        inner = getattr(optimizer, "optimizer", optimizer)
        if any(id(p) in own for group in inner.param_groups for p in group["params"]):
            raise ValueError(
                f"the optimizer {type(inner).__name__} was prepared before its model "
                f"{type(model).__name__}: FSDP replaces the model's parameters by shards, so "
                "the model must be prepared first or together with it: "
                "`model, optimizer = accelerator.prepare(model, optimizer)`"
            )
