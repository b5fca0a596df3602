"""Fully sharded data parallel on PyTorch's FSDP2 (``fully_shard``): every process holds 1/N of
each parameter, gradient and optimizer state. The sharding itself lives in ``runtime/fsdp/``;
this is the strategy that puts it behind the common interface."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ..._flags import parse_flag
from ..enums import DistributedType
from ..fsdp.gradients import clip_sharded_grad_norm_, gradient_sync
from ..fsdp.notices import say_once
from ..fsdp.optimizer_params import check_not_prepared_before, move_onto_shards
from ..fsdp.plugin import FSDP1_ONLY, FullyShardedDataParallelPlugin
from ..fsdp.sharding import is_fsdp_module, shard_model
from .parts import StateDictsInParts
from .strategy import ModelSetup, ShardingStrategy

__all__ = ["FullyShardedStrategy", "fsdp_plugin_from"]

_MULTI = (DistributedType.MULTI_CPU, DistributedType.MULTI_GPU)


def fsdp_plugin_from(plugin: Any) -> FullyShardedDataParallelPlugin | None:
    """The plugin given to ``Accelerator(fsdp_plugin=...)``, or one built from the ``FSDP_*``
    variables when the launch turned FSDP on (``ACCELERATE_USE_FSDP=true``)."""
    if plugin is None:
        if not parse_flag(os.environ.get("ACCELERATE_USE_FSDP") or "false", "ACCELERATE_USE_FSDP"):
            return None
        plugin = FullyShardedDataParallelPlugin()
    if not isinstance(plugin, FullyShardedDataParallelPlugin):
        if type(plugin).__name__ != "FullyShardedDataParallelPlugin":
            raise TypeError(
                f"fsdp_plugin must be a FullyShardedDataParallelPlugin, not {type(plugin).__name__}"
            )
        plugin = _convert(plugin)  # Accelerate's own plugin class
    for option, text in plugin.take_notes():
        say_once(option, text, stacklevel=3)
    return plugin


def _convert(plugin: Any) -> FullyShardedDataParallelPlugin:
    """Our plugin with the fields of another library's ``FullyShardedDataParallelPlugin``
    (less the FSDP1 options, which that library fills in by itself, and itself warns about
    under FSDP2). Its ``auto_wrap_policy`` arrives as torch's policy function (Accelerate turns
    ``"transformer_based_wrap"`` into ``transformer_auto_wrap_policy``), which finds the layer
    classes as every policy by class does when none are named."""
    names = set(FullyShardedDataParallelPlugin.__dataclass_fields__) - {"notes", *FSDP1_ONLY}
    fields = {n: getattr(plugin, n) for n in names if hasattr(plugin, n)}
    return FullyShardedDataParallelPlugin(**fields)


def _sharded_module(model: torch.nn.Module) -> torch.nn.Module | None:
    """The FSDP2 module of ``model`` (compiled or not), or None."""
    inner = getattr(model, "_orig_mod", model)
    return inner if is_fsdp_module(inner) else None


@dataclass(frozen=True)
class FullyShardedStrategy(StateDictsInParts, ShardingStrategy):
    """FSDP2 with the options of a :class:`FullyShardedDataParallelPlugin`, on several
    processes on CPUs or GPUs."""

    name: ClassVar[str] = "fsdp2"
    label: ClassVar[str] = "FSDP"
    models_first: ClassVar[bool] = True
    places_model: ClassVar[bool] = False
    #: The CPU offload's shards, gradients and optimizer state meet in CPU collectives (the
    #: plugin is often made inside the function, where the launch cannot see whether it offloads).
    cpu_collectives: ClassVar[bool] = True
    needs_process_group: ClassVar[bool] = True

    plugin: FullyShardedDataParallelPlugin

    @classmethod
    def worker_env(cls) -> dict[str, str]:
        """``ACCELERATE_USE_FSDP=true`` and ``FSDP_VERSION=2`` (read by Accelerate too)."""
        return {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"}

    @classmethod
    def launch_title(cls, shards: int) -> str | None:
        """``"FSDP, 2 shards"``: one shard per rank of the launch."""
        return f"FSDP, {shards} shard{'s' if shards > 1 else ''}"

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> ShardingStrategy | None:
        """When an ``fsdp_plugin`` is given (the Accelerator reads ``ACCELERATE_USE_FSDP``
        into one with :func:`fsdp_plugin_from`)."""
        plugin = options.get("fsdp_plugin")
        return cls(plugin) if plugin is not None else None

    def distributed_type(self, kind: DistributedType) -> DistributedType:
        """``FSDP`` where it shards (several processes on CPUs or GPUs), else ``kind``."""
        return DistributedType.FSDP if kind in _MULTI else kind

    def runs_on(self, kind: DistributedType) -> bool:
        """Several processes on CPUs or GPUs (not one process, not XLA)."""
        return kind in _MULTI

    def wraps(self, model: torch.nn.Module, setup: ModelSetup) -> bool:
        """Always: a model without parameters is refused when it is sharded."""
        del model, setup
        return True

    def wrap_model(self, model: torch.nn.Module, setup: ModelSetup) -> torch.nn.Module:
        """``model`` sharded in place from rank 0's weights; what changed is kept in
        ``setup.changed`` for the optimizers prepared after it."""
        check_not_prepared_before(model, setup.optimizers)
        setup.changed.append(
            shard_model(model, self.plugin, setup.device, setup.mixed_precision, setup.mesh)
        )
        return model

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, setup: ModelSetup) -> None:
        """Point ``optimizer`` at the shards of the models prepared so far."""
        if setup.changed:
            move_onto_shards(optimizer, setup.changed)

    @classmethod
    def no_sync(cls, model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        """No reduce-scatter: gradients accumulate unreduced on each process."""
        sharded = _sharded_module(model)
        return gradient_sync(sharded, False) if sharded is not None else contextlib.nullcontext()

    @classmethod
    def sync_in_backward(cls, model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        """The next backward pass reduce-scatters its gradients."""
        sharded = _sharded_module(model)
        return gradient_sync(sharded, True) if sharded is not None else contextlib.nullcontext()

    def clip_grad_norm_(
        self, parameters: torch.Tensor | Iterable[torch.Tensor], max_norm: float, norm_type: float
    ) -> torch.Tensor | None:
        """By the norm of the whole (sharded) gradient, the same on every process."""
        return clip_sharded_grad_norm_(parameters, max_norm, norm_type)

    def is_sharded(self, model: torch.nn.Module) -> bool:
        """True for a module sharded with ``fully_shard``."""
        return is_fsdp_module(model)

    def checkpoint_layout(self, models: list[torch.nn.Module]) -> str | None:
        """The plugin's ``state_dict_type`` when some model is sharded."""
        if not any(is_fsdp_module(m) for m in models):
            return None
        return str(self.plugin.state_dict_type.name)

    @classmethod
    def worker_only_advice(cls, value: Any) -> str | None:
        """A shard of a tensor or a sharded model; only looked for once FSDP is loaded."""
        tensors = sys.modules.get("torch.distributed.tensor")
        if tensors is not None and isinstance(value, tensors.DTensor):
            return (
                "it is one process's shard of a sharded (FSDP) tensor: return "
                "`tensor.full_tensor()` (on every process), or the model's whole weights with "
                "`accelerator.get_state_dict(model)` (filled on the main process)"
            )
        fsdp = sys.modules.get("torch.distributed.fsdp")
        if fsdp is not None and isinstance(value, fsdp.FSDPModule):
            return (
                "it holds one process's shards of the model: return "
                "`accelerator.get_state_dict(model)` (the whole weights, filled on the main "
                "process) and load them into a plain model in the kernel"
            )
        return None
