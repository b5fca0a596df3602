"""Preparing a model: device placement, autocast forward, DistributedDataParallel; and back."""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from ..options import DistributedDataParallelKwargs
from ..state import DistributedType, PartialState
from .precision import autocast_forward

__all__ = ["prepare_model", "unwrap_model"]

_COMM_FIELDS = ("comm_hook", "comm_wrapper", "comm_state_option")


def prepare_model(
    model: torch.nn.Module,
    state: PartialState,
    mixed_precision: str,
    device_placement: bool,
    ddp_kwargs: dict[str, Any] | None = None,
    wrap: bool = True,
) -> torch.nn.Module:
    """Move ``model`` to the device, run its forward under autocast when mixed precision is on,
    and (``wrap``) put it in ``DistributedDataParallel`` when several processes take part.

    ``ddp_kwargs`` may hold the communication hook settings of
    :class:`DistributedDataParallelKwargs`; the hook is registered on the wrapped model.
    """
    options = dict(ddp_kwargs or {})
    hook_settings = {name: options.pop(name) for name in _COMM_FIELDS if name in options}
    if device_placement:
        model = model.to(state.device)
    if mixed_precision != "no" and not hasattr(model.forward, "__nb_accel_original_forward__"):
        model.forward = autocast_forward(model.forward, mixed_precision, state.device)  # type: ignore[method-assign]
    if wrap and state.distributed_type in (DistributedType.MULTI_CPU, DistributedType.MULTI_GPU):
        if any(p.requires_grad for p in model.parameters()):
            device_ids = [state.local_process_index] if state.device.type == "cuda" else None
            model = DistributedDataParallel(model, device_ids=device_ids, **options)
            if hook_settings:
                DistributedDataParallelKwargs(**hook_settings).register_comm_hook(model)
    return model


def unwrap_model(model: torch.nn.Module, keep_fp32_wrapper: bool = True) -> torch.nn.Module:
    """The original model from a prepared one (``DistributedDataParallel`` and compile removed).

    With ``keep_fp32_wrapper=False`` the autocast forward added by mixed precision is removed
    as well.
    """
    while isinstance(model, DistributedDataParallel) or hasattr(model, "_orig_mod"):
        model = model.module if isinstance(model, DistributedDataParallel) else model._orig_mod  # type: ignore[assignment]
    if not keep_fp32_wrapper:
        if hasattr(model.forward, "__nb_accel_original_forward__"):
            del model.forward  # the class's own forward shows through again
    return model
