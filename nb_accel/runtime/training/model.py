"""Preparing a model: device placement, autocast forward, the sharding strategy's wrap
(``DistributedDataParallel``, FSDP2), compile; and back."""

from __future__ import annotations

from typing import Any

import torch

from ..parallelism.context import drop_attention_masks
from ..parallelism.tensor import check_tensor_parallel
from ..sharding import ModelSetup, ShardingStrategy
from ..sharding.registry import unwrap_once
from .compile import TorchDynamoPlugin, compile_model, has_compiled_regions, is_compiled_module
from .precision import autocast_forward

__all__ = ["get_module_children_bottom_up", "prepare_model", "unwrap_model"]


def prepare_model(
    model: torch.nn.Module,
    strategy: ShardingStrategy,
    setup: ModelSetup,
    device_placement: bool,
    wrap: bool = True,
    dynamo_plugin: TorchDynamoPlugin | None = None,
) -> torch.nn.Module:
    """Move ``model`` to the device (unless the strategy places it), run its forward under
    autocast when mixed precision is on, (``wrap``) wrap it as ``strategy`` says, and compile
    it with ``torch.compile`` when ``dynamo_plugin`` names a backend: before the wrap or after
    it, as the strategy says. A model to wrap under tensor parallelism (``setup.tp_size``)
    must come parallelised over that many ranks."""
    if device_placement and (strategy.places_model or not wrap):
        model = model.to(setup.device)
    precision = setup.mixed_precision
    if precision != "no" and not hasattr(model.forward, "__nb_accel_original_forward__"):
        model.forward = autocast_forward(model.forward, precision, setup.device)  # type: ignore[method-assign]
    wrap = wrap and strategy.wraps(model, setup)
    if wrap and setup.tp_size > 1:
        check_tensor_parallel(model, setup.tp_size)
    if setup.cp_size > 1:  # torch's ring attention takes no masks
        drop_attention_masks(model)
    fullgraph = bool(dynamo_plugin is not None and dynamo_plugin.fullgraph)
    if dynamo_plugin is not None and (not wrap or strategy.compiles_before_wrap(model, fullgraph)):
        model = compile_model(model, dynamo_plugin)
    if wrap:
        compiled_first = is_compiled_module(model)
        model = strategy.wrap_model(model, setup)
        if not compiled_first:  # compiled after the wrap, as in Accelerate
            model = compile_model(model, dynamo_plugin)
    return model


def unwrap_model(
    model: torch.nn.Module,
    keep_fp32_wrapper: bool = True,
    keep_torch_compile: bool = False,
    recursive: bool = False,
) -> torch.nn.Module:
    """The original model from a prepared one (the strategy's wrapper, such as
    ``DistributedDataParallel``, ``torch.nn.DataParallel`` and compile removed, however nested).

    With ``keep_fp32_wrapper=False`` the autocast forward added by mixed precision is removed
    as well. With ``keep_torch_compile=True`` a compiled model comes back compiled: the original
    model in a ``torch.compile`` wrapper with the same options (its ``state_dict()`` keys then
    start with ``_orig_mod.``), and one compiled with ``compile_regions`` comes back as it is
    when it holds the original model directly. With ``recursive=True`` the submodules wrapped
    in a parallel container are replaced by the modules they wrap, in place.
    """
    compiled = None
    while True:
        if is_compiled_module(model) or has_compiled_regions(model):
            compiled = compiled or model
            model = model._orig_mod  # type: ignore[assignment]
            continue
        inner = _parallel_inner(model)
        if inner is None:
            break
        model = inner
    if recursive:
        _unwrap_submodules(model)
    if not keep_fp32_wrapper:
        _restore_forward(model)
    if keep_torch_compile and compiled is not None:
        if compiled._orig_mod is model:
            return compiled
        if is_compiled_module(compiled):
            return type(compiled)(model, compiled.dynamo_ctx)  # type: ignore[operator]
    return model


def _restore_forward(model: torch.nn.Module) -> None:
    """Take off ``model`` the forward that mixed precision (or code doing as Accelerate does:
    ``model._original_forward = model.forward`` before replacing it with
    ``convert_outputs_to_fp32``) put on it: the one kept in ``_original_forward`` comes back, or
    the class's own shows through again."""
    own = model.__dict__
    original = own.pop("_original_forward", None)
    if original is None:
        if hasattr(model.forward, "__nb_accel_original_forward__"):
            del model.forward
        return
    if getattr(original, "__self__", None) is model and getattr(
        original, "__func__", None
    ) is getattr(type(model), "forward", None):
        own.pop("forward", None)  # the class's forward, bound anew (and picklable)
    else:
        model.forward = original


def _parallel_inner(model: torch.nn.Module) -> torch.nn.Module | None:
    """The module inside the parallel container ``model`` (a strategy's wrapper or
    ``torch.nn.DataParallel``); None when ``model`` is not one."""
    if isinstance(model, torch.nn.DataParallel):
        return model.module  # type: ignore[no-any-return]
    return unwrap_once(model)


def _unwrap_submodules(model: torch.nn.Module) -> None:
    """Replace, in place and at any depth, each submodule of ``model`` that is a parallel
    container by the module it wraps."""
    for name, child in list(model.named_children()):
        inner = child
        while (unwrapped := _parallel_inner(inner)) is not None:
            inner = unwrapped
        if inner is not child:
            setattr(model, name, inner)
        _unwrap_submodules(inner)


def get_module_children_bottom_up(model: torch.nn.Module, return_fqns: bool = False) -> list[Any]:
    """Every module of ``model`` once, each after its children (in their order), ``model``
    last; with ``return_fqns`` as ``(qualified name, module)`` pairs (``""`` for ``model``)."""
    found: list[tuple[str, torch.nn.Module]] = []
    seen: set[int] = set()

    def visit(module: torch.nn.Module, name: str) -> None:
        seen.add(id(module))
        for child_name, child in module.named_children():
            if id(child) not in seen:
                visit(child, f"{name}.{child_name}" if name else child_name)
        found.append((name, module))

    visit(model, "")
    return found if return_fqns else [module for _, module in found]
