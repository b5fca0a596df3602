"""Activation checkpointing of FSDP units, and its offload of what they save to CPU memory.

Each unit below the model (each layer the wrap policy chose) is replaced in its parent by
torch's ``checkpoint_wrapper`` around it: the activations inside the unit are not kept from the
forward to the backward pass but recomputed there, so the unit's forward runs twice per step.
With ``activation_checkpointing_offload`` torch's ``offload_wrapper`` goes around that: what the
checkpoint still saves for its recompute (the unit's inputs) waits for the backward pass in CPU
memory (``torch.autograd.graph.save_on_cpu``). The wrappers are applied before ``fully_shard``,
which then shards the wrapper as the unit; parameter names gain torch's
``_checkpoint_wrapped_module`` prefix, which the state dicts (and so checkpoints and
``get_state_dict``) leave out.
"""

from __future__ import annotations

import torch

from .notices import say_no_effect

__all__ = ["checkpoint_units", "is_checkpointed", "is_offloaded"]


def _wrap(unit: torch.nn.Module, offload: bool) -> torch.nn.Module:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        checkpoint_wrapper,
        offload_wrapper,
    )

    # the random state is restored for the recompute, so dropout draws the same masks twice
    wrapped = checkpoint_wrapper(unit, preserve_rng_state=True)
    return offload_wrapper(wrapped) if offload else wrapped


def checkpoint_units(
    model: torch.nn.Module, units: list[tuple[str, torch.nn.Module]], offload: bool
) -> list[tuple[str, torch.nn.Module]]:
    """Put each of ``units`` (names in ``model``, children before parents) inside the
    checkpoint wrapper (and, with ``offload``, the offload wrapper around it), in place in
    ``model``; the units as they are now, with their names, in the same order.

    A unit inside another unit is wrapped too; the outer one's recompute then runs the inner
    one's checkpointed forward, as nested ``checkpoint_wrapper`` layers do in torch.
    """
    if not units:
        say_no_effect(
            "activation_checkpointing",
            "no layer of the model is its own FSDP unit; choose the layers with "
            "auto_wrap_policy / transformer_cls_names_to_wrap",
            stacklevel=4,
        )
        return []
    wrapped: list[tuple[str, torch.nn.Module]] = []
    for name, unit in units:
        replacement = _wrap(unit, offload)
        model.set_submodule(name, replacement)
        wrapped.append((name, replacement))
    return wrapped


def is_checkpointed(module: torch.nn.Module) -> bool:
    """True for a unit inside torch's checkpoint wrapper (offloaded or not)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    inner = getattr(module, "_checkpoint_wrapped_module", None)
    return isinstance(module, CheckpointWrapper) or isinstance(inner, CheckpointWrapper)


def is_offloaded(module: torch.nn.Module) -> bool:
    """True for a checkpointed unit whose saved inputs wait in CPU memory."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import OffloadWrapper

    return isinstance(module, OffloadWrapper)
