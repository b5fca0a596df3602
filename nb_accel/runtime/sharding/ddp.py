"""Data parallel: every process holds the whole model, wrapped in ``DistributedDataParallel``
when several processes take part (left as it is on one process), its gradients all-reduced
after each backward pass. The default strategy.

A tensor parallel model (``ParallelismConfig(tp_size=...)`` spanning every process) is not
wrapped: its ``DTensor`` layers are spread over the ranks already, the rest is made the main
process's on each; its state dicts and checkpoints go through ``torch.distributed.checkpoint``
as a sharded model's."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch.nn.parallel import DistributedDataParallel

from ..enums import DistributedType
from ..fsdp.gradients import clip_sharded_grad_norm_
from ..parallelism.tensor import (
    any_dtensor,
    has_dtensor_parameters,
    replicate_plain_parameters,
)
from .parts import StateDictsInParts
from .strategy import ModelSetup, ShardingStrategy

__all__ = ["DataParallelStrategy", "find_ddp"]

_COMM_FIELDS = ("comm_hook", "comm_wrapper", "comm_state_option")
_MULTI = (DistributedType.MULTI_CPU, DistributedType.MULTI_GPU)


def find_ddp(model: Any) -> DistributedDataParallel | None:
    """The ``DistributedDataParallel`` of a prepared model, under a compiled wrapper or not."""
    while isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
        model = model._orig_mod
    return model if isinstance(model, DistributedDataParallel) else None


@dataclass(frozen=True)
class DataParallelStrategy(StateDictsInParts, ShardingStrategy):
    """``DistributedDataParallel`` on several processes (CPU or GPU), nothing on one."""

    name: ClassVar[str] = "ddp"
    label: ClassVar[str] = "DDP"

    @classmethod
    def worker_env(cls) -> dict[str, str]:
        """``ACCELERATE_USE_FSDP=false``, so that a value left in the kernel's environment
        cannot turn sharding on."""
        return {"ACCELERATE_USE_FSDP": "false"}

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> ShardingStrategy | None:
        """When the launch named it (``options["sharding"]``); data parallel itself is also the
        default, which no option needs to ask for. A subclass under a name of its own is thus
        chosen in the ranks of the launches that name it, and nowhere else."""
        return cls() if options.get("sharding") == cls.name else None

    def wraps(self, model: torch.nn.Module, setup: ModelSetup) -> bool:
        """Several processes on CPUs or GPUs, and parameters to train."""
        multi = setup.distributed_type in _MULTI
        return multi and any(p.requires_grad for p in model.parameters())

    def compiles_before_wrap(self, model: torch.nn.Module, fullgraph: bool) -> bool:
        """A model is compiled after the wrap, so that torch's DDP optimizer splits the graph at
        the gradient buckets; before it with ``fullgraph`` (DDP's own forward is not one graph)
        and for a model whose class is torch's own (torch leaves its forward uncompiled when
        DDP calls it)."""
        return bool(fullgraph) or type(model).__module__.startswith("torch.")

    def wrap_model(self, model: torch.nn.Module, setup: ModelSetup) -> torch.nn.Module:
        """``DistributedDataParallel`` with the options of the Accelerator's
        ``DistributedDataParallelKwargs``, whose communication hook, when it sets one, is
        registered on the wrapped model."""
        handler = setup.handlers.get("DistributedDataParallelKwargs")
        options = dict(handler.to_kwargs()) if handler is not None else {}
        if setup.tp_size > 1:  # the whole launch is one tensor parallel group
            replicate_plain_parameters(model)
            return model
        hook_settings = {name: options.pop(name) for name in _COMM_FIELDS if name in options}
        device_ids = setup.device_type.model_device_ids(setup.device)
        wrapped = DistributedDataParallel(model, device_ids=device_ids, **options)
        if hook_settings and handler is not None:
            handler.register_comm_hook(wrapped)
        return wrapped

    @classmethod
    def unwrap(cls, model: torch.nn.Module) -> torch.nn.Module | None:
        """The model a ``DistributedDataParallel`` wraps."""
        return model.module if isinstance(model, DistributedDataParallel) else None

    def joinable(self, model: Any) -> Any:
        """The ``DistributedDataParallel`` of a prepared model (compiled or not)."""
        return find_ddp(model) or model

    @classmethod
    def no_sync(cls, model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        """DDP's ``no_sync()``."""
        ddp = find_ddp(model)
        return ddp.no_sync() if ddp is not None else contextlib.nullcontext()

    def clip_grad_norm_(
        self, parameters: torch.Tensor | Iterable[torch.Tensor], max_norm: float, norm_type: float
    ) -> torch.Tensor | None:
        """A tensor parallel model's gradients by the norm of the whole gradient (its
        ``DTensor`` parts and the rest); None for whole gradients, which the Accelerator
        clips itself."""
        parameters = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        if not any_dtensor(p.grad for p in parameters):
            return None
        return clip_sharded_grad_norm_(parameters, max_norm, norm_type)

    def is_sharded(self, model: torch.nn.Module) -> bool:
        """True for a tensor parallel model (its ``DTensor`` layers are spread over ranks)."""
        return has_dtensor_parameters(model)

    def checkpoint_layout(self, models: list[torch.nn.Module]) -> str | None:
        """``SHARDED_STATE_DICT`` when some model is tensor parallel (each rank writes its
        parts with ``torch.distributed.checkpoint``); else the ordinary files."""
        return "SHARDED_STATE_DICT" if any(has_dtensor_parameters(m) for m in models) else None

    @classmethod
    def sync_in_backward(cls, model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        """The reducer readied for the next backward pass, whatever ``no_sync`` said."""
        ddp = find_ddp(model)
        return _synchronising(ddp) if ddp is not None else contextlib.nullcontext()


@contextlib.contextmanager
def _synchronising(model: DistributedDataParallel) -> Iterator[None]:
    saved = (model.require_backward_grad_sync, model.require_forward_param_sync)
    model.require_backward_grad_sync = True
    model.require_forward_param_sync = True
    model.reducer.prepare_for_backward([])  # the forward pass under no_sync skipped it
    try:
        yield
    finally:
        model.require_backward_grad_sync, model.require_forward_param_sync = saved
