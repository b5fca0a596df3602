"""Training on XLA: averaging gradients across ranks, the optimizer step, moved parameters.

There is no ``DistributedDataParallel`` on XLA: gradients are averaged across ranks right
before the optimizer steps (``xm.optimizer_step``), or earlier when they are clipped, and the
step ends with ``mark_step`` so that every rank runs the step's graph. Imported only on the
XLA path.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch_xla.core.xla_model as xm

from .device import mark_step, world_size

__all__ = [
    "reduce_gradients",
    "optimizer_step",
    "parameters_by_model",
    "follow_moved_parameters",
    "share_rank0_parameters",
]


def reduce_gradients(optimizer: torch.optim.Optimizer) -> None:
    """Average the gradients of ``optimizer``'s parameters across ranks (in place)."""
    xm.reduce_gradients(optimizer)


def optimizer_step(
    optimizer: torch.optim.Optimizer,
    closure: Callable[[], float] | None,
    gradients_reduced: bool,
) -> Any:
    """``xm.optimizer_step`` (average the gradients, step), then ``mark_step``.

    Args:
        optimizer: the wrapped optimizer.
        closure: passed to ``optimizer.step`` when given.
        gradients_reduced: the gradients were averaged already this step (for clipping).
    """
    options = {"closure": closure} if closure is not None else {}
    if gradients_reduced:
        result = optimizer.step(**options)
    else:
        result = xm.optimizer_step(optimizer, optimizer_args=options)
    mark_step()
    return result


#: Each prepared module with its parameters by name, as they were before the move.
ParameterSnapshot = list[tuple[torch.nn.Module, dict[str, torch.nn.Parameter]]]


def parameters_by_model(objects: Iterable[Any]) -> ParameterSnapshot:
    """Each module among ``objects`` with its parameters by name, before it is moved."""
    return [
        (obj, dict(obj.named_parameters())) for obj in objects if isinstance(obj, torch.nn.Module)
    ]


def _raw_optimizer(obj: Any) -> torch.optim.Optimizer | None:
    inner = getattr(obj, "optimizer", obj)
    return inner if isinstance(inner, torch.optim.Optimizer) else None


def follow_moved_parameters(before: ParameterSnapshot, objects: Iterable[Any]) -> None:
    """Point the optimizers among ``objects`` at their models' parameters on the XLA device.

    Moving a module to an XLA device replaces its ``Parameter`` objects (unlike a move between
    CPU and CUDA), so an optimizer built before :meth:`~nb_accel.Accelerator.prepare` would
    otherwise keep updating the old CPU parameters.
    """
    moved: dict[torch.Tensor, torch.nn.Parameter] = {}
    for module, old in before:
        new = dict(module.named_parameters())
        moved.update({param: new[name] for name, param in old.items() if name in new})
    if not moved:
        return
    for obj in objects:
        optimizer = _raw_optimizer(obj)
        if optimizer is None:
            continue
        for group in optimizer.param_groups:
            group["params"] = [moved.get(param, param) for param in group["params"]]
        state: defaultdict[Any, Any] = defaultdict(dict)
        for key, value in optimizer.state.items():
            param = moved.get(key, key)
            state[param] = {name: _beside(item, param) for name, item in value.items()}
        optimizer.state = state


def _beside(value: Any, param: torch.Tensor) -> Any:
    """An optimizer state entry on its parameter's device (scalar step counters stay put)."""
    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.device != param.device:
        return value.to(param.device)
    return value


def share_rank0_parameters(objects: Iterable[Any]) -> None:
    """Give every rank rank 0's parameters and buffers of each model among ``objects``, as
    ``DistributedDataParallel`` does when it wraps a model.

    Ranks that are processes start alike when they seed alike; ranks that are threads of one
    process (TPU v2/v3) draw their initial values from one shared generator, in turns, and
    would start (and stay) different.
    """
    if world_size() == 1:
        return
    tensors = [
        tensor
        for obj in objects
        if isinstance(obj, torch.nn.Module)
        for tensor in (*obj.parameters(), *obj.buffers())
    ]
    if tensors:
        xm.collective_broadcast(tensors, root_ordinal=0)
        mark_step()
