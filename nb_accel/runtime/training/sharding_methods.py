"""The Accelerator's sharding side: which strategy prepares its models (``runtime/sharding/``),
and what a model and an optimizer need from it when they are prepared."""

from __future__ import annotations

import warnings
from typing import Any

from ..fsdp.plugin import FullyShardedDataParallelPlugin
from ..sharding import ModelSetup, ShardingStrategy
from ..state import AcceleratorState, DistributedType, PartialState

__all__ = ["ShardingMethods"]


class ShardingMethods:
    """Mixin of :class:`Accelerator`: the sharding strategy through ``prepare()``."""

    state: AcceleratorState
    _partial: PartialState
    _handlers: dict[str, Any]
    _optimizers: list[Any]
    _sharded: list[Any]

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

    @property
    def _sharding(self) -> ShardingStrategy:
        """The strategy that prepares this Accelerator's models."""
        return self.state.sharding

    def _note_unsharded(self) -> None:
        """Say so when a sharding strategy was asked for but this run has a single process (or
        runs on XLA): models are then prepared unsharded."""
        chosen = self.state.chosen_sharding
        if chosen.name != self._sharding.name:
            why = (
                "this run has a single process (launch several to shard)"
                if self._partial.num_processes == 1
                else f"it does not run on {self.state.distributed_type.value}"
            )
            warnings.warn(
                f"{chosen.label} shards a model across the processes of a launch, and {why}: "
                "prepared models are not sharded",
                stacklevel=3,
            )

    def _model_setup(self, mixed_precision: str) -> ModelSetup:
        """What the strategy needs from this Accelerator to prepare a model or an optimizer."""
        return ModelSetup(
            device=self._partial.device,
            local_process_index=self._partial.local_process_index,
            distributed_type=self._partial.distributed_type,
            mixed_precision=mixed_precision,
            handlers=self._handlers,
            optimizers=self._optimizers,
            changed=self._sharded,
        )
