"""The Accelerator's sharding side: choosing FSDP, sharding prepared models and moving their
optimizers onto the shards."""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch

from ..fsdp.optimizer_params import check_not_prepared_before, move_onto_shards
from ..fsdp.plugin import FSDP1_ONLY, FullyShardedDataParallelPlugin, parse_flag
from ..fsdp.sharding import ShardedModel, shard_model
from ..state import AcceleratorState, DistributedType, PartialState
from .compile import TorchDynamoPlugin, compile_model
from .precision import autocast_forward

__all__ = ["ShardingMethods", "fsdp_plugin_from"]


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
    for note in plugin.take_notes():
        warnings.warn(f"FullyShardedDataParallelPlugin: {note}", stacklevel=4)
    return plugin


def _convert(plugin: Any) -> FullyShardedDataParallelPlugin:
    """Our plugin with the fields of another library's ``FullyShardedDataParallelPlugin``
    (less the FSDP1 options, which that library fills in by itself)."""
    names = set(FullyShardedDataParallelPlugin.__dataclass_fields__) - {"notes", *FSDP1_ONLY}
    fields = {n: getattr(plugin, n) for n in names if hasattr(plugin, n)}
    return FullyShardedDataParallelPlugin(**fields)


class ShardingMethods:
    """Mixin of :class:`Accelerator`: FSDP2 through ``prepare()``."""

    state: AcceleratorState
    _partial: PartialState
    _optimizers: list[Any]
    _sharded: list[ShardedModel]
    _dynamo_plugin: TorchDynamoPlugin

    @property
    def distributed_type(self) -> DistributedType:
        """The kind of distributed setup (``FSDP`` when models are sharded)."""
        return self.state.distributed_type

    @property
    def is_fsdp2(self) -> bool:
        """True when prepared models are sharded with FSDP2 (``fully_shard``)."""
        return self.state.distributed_type == DistributedType.FSDP

    @property
    def fsdp_plugin(self) -> FullyShardedDataParallelPlugin | None:
        """The sharding options, when FSDP is on."""
        return self.state.fsdp_plugin if self.is_fsdp2 else None

    def _note_unsharded(self) -> None:
        """Say so when FSDP was asked for but this run has a single process (or runs on XLA):
        models are then prepared unsharded."""
        if self.state.fsdp_plugin is not None and not self.is_fsdp2:
            why = (
                "this run has a single process (launch several to shard)"
                if self._partial.num_processes == 1
                else f"it does not run on {self.state.distributed_type.value}"
            )
            warnings.warn(
                f"FSDP shards a model across the processes of a launch, and {why}: prepared "
                "models are not sharded",
                stacklevel=3,
            )

    def _shard(self, model: torch.nn.Module, mixed_precision: str) -> torch.nn.Module:
        """Shard ``model`` with the plugin's options (autocast forward under mixed precision,
        compiled after with a dynamo backend)."""
        check_not_prepared_before(model, self._optimizers)
        plugin = self.state.fsdp_plugin
        if mixed_precision != "no" and not hasattr(model.forward, "__nb_accel_original_forward__"):
            model.forward = autocast_forward(model.forward, mixed_precision, self._partial.device)  # type: ignore[method-assign]
        self._sharded.append(shard_model(model, plugin, self._partial.device, mixed_precision))
        return compile_model(model, self._dynamo_plugin)

    def _onto_shards(self, optimizer: torch.optim.Optimizer) -> None:
        """Point ``optimizer`` at the shards of the models prepared so far."""
        if self._sharded:
            move_onto_shards(optimizer, self._sharded)
