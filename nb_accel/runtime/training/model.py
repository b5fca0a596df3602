"""Preparing a model: device placement, autocast forward, DistributedDataParallel, compile; and
back."""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from ..options import DistributedDataParallelKwargs
from ..state import DistributedType, PartialState
from .compile import TorchDynamoPlugin, compile_model, compiles_inside_ddp, is_compiled_module
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
    dynamo_plugin: TorchDynamoPlugin | None = None,
) -> torch.nn.Module:
    """Move ``model`` to the device, run its forward under autocast when mixed precision is on,
    (``wrap``) put it in ``DistributedDataParallel`` when several processes take part, and
    compile it with ``torch.compile`` when ``dynamo_plugin`` names a backend.

    ``ddp_kwargs`` may hold the communication hook settings of
    :class:`DistributedDataParallelKwargs`; the hook is registered on the wrapped model.
    """
    options = dict(ddp_kwargs or {})
    hook_settings = {name: options.pop(name) for name in _COMM_FIELDS if name in options}
    if device_placement:
        model = model.to(state.device)
    if mixed_precision != "no" and not hasattr(model.forward, "__nb_accel_original_forward__"):
        model.forward = autocast_forward(model.forward, mixed_precision, state.device)  # type: ignore[method-assign]
    wrap = wrap and state.distributed_type in (DistributedType.MULTI_CPU, DistributedType.MULTI_GPU)
    wrap = wrap and any(p.requires_grad for p in model.parameters())
    if dynamo_plugin is not None and (not wrap or compiles_inside_ddp(model, dynamo_plugin)):
        model = compile_model(model, dynamo_plugin)
    if wrap:
        device_ids = [state.local_process_index] if state.device.type == "cuda" else None
        model = DistributedDataParallel(model, device_ids=device_ids, **options)
        if hook_settings:
            DistributedDataParallelKwargs(**hook_settings).register_comm_hook(model)
        if not is_compiled_module(model.module):  # compiled after the wrap, as in Accelerate
            model = compile_model(model, dynamo_plugin)
    return model


def unwrap_model(
    model: torch.nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = False
) -> torch.nn.Module:
    """The original model from a prepared one (``DistributedDataParallel`` and compile removed).

    With ``keep_fp32_wrapper=False`` the autocast forward added by mixed precision is removed
    as well. With ``keep_torch_compile=True`` a compiled model comes back compiled: the original
    model in a ``torch.compile`` wrapper with the same options (its ``state_dict()`` keys then
    start with ``_orig_mod.``).
    """
    compiled = None
    while isinstance(model, DistributedDataParallel) or is_compiled_module(model):
        if isinstance(model, DistributedDataParallel):
            model = model.module
        else:
            compiled = compiled or model
            model = model._orig_mod  # type: ignore[assignment]
    if not keep_fp32_wrapper:
        if hasattr(model.forward, "__nb_accel_original_forward__"):
            del model.forward  # the class's own forward shows through again
    if keep_torch_compile and compiled is not None:
        if compiled._orig_mod is model:
            return compiled
        return type(compiled)(model, compiled.dynamo_ctx)  # type: ignore[operator]
    return model
