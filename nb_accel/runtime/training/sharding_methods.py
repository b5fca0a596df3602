"""The Accelerator's sharding side: which strategy prepares its models (``runtime/sharding/``),
and what a model and an optimizer need from it when they are prepared."""

from __future__ import annotations

import warnings
from typing import Any

from ..fsdp.plugin import FullyShardedDataParallelPlugin
from ..parallelism import ParallelismConfig
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
    def parallelism_config(self) -> ParallelismConfig | None:
        """The :class:`ParallelismConfig` given (or read from the environment), with the size
        of the dimension that runs set to the number of processes; None when none was."""
        return getattr(self.state, "parallelism_config", None)

    def _configured(self, what: str) -> ParallelismConfig:
        config = self.parallelism_config
        if config is None:
            raise RuntimeError(
                f"{what} is not configured: pass Accelerator(parallelism_config="
                "ParallelismConfig(...)) first"
            )
        return config

    @property
    def data_parallel_rank(self) -> int:
        """This process's index among the model's replicas (``DistributedDataParallel``); 0
        when the models are sharded instead."""
        replicated = self._configured("Data parallelism").dp_replicate_enabled
        return self._partial.process_index if replicated else 0

    @property
    def data_parallel_shard_rank(self) -> int:
        """This process's index among the model's FSDP2 shards; 0 when models are replicated."""
        sharded = self._configured("Shard-based data parallelism").dp_shard_enabled
        return self._partial.process_index if sharded else 0

    @property
    def tensor_parallel_rank(self) -> int:
        """0: nb_accel runs no tensor parallelism (every process holds whole tensors)."""
        self._configured("Tensor parallelism")
        return 0

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
