"""The Accelerator's sharding side: which strategy prepares its models (``runtime/sharding/``),
and what a model and an optimizer need from it when they are prepared."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from ..fsdp.plugin import FullyShardedDataParallelPlugin
from ..parallelism import ParallelismConfig
from ..sharding import ModelSetup, ShardingStrategy
from ..state import AcceleratorState, DistributedType, PartialState

__all__ = ["ShardingMethods"]

#: Accelerate's data parallel kinds on accelerators (``multi_device``).
_MULTI_DEVICE = {
    DistributedType.MULTI_GPU,
    DistributedType.MULTI_MLU,
    DistributedType.MULTI_SDAA,
    DistributedType.MULTI_MUSA,
    DistributedType.MULTI_NPU,
    DistributedType.MULTI_XPU,
    DistributedType.MULTI_HPU,
    DistributedType.MULTI_NEURON,
}


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
    def context_parallel_rank(self) -> int:
        """Refused, as in Accelerate: context parallelism is not supported."""
        raise NotImplementedError("context parallelism is not supported by nb_accel")

    @property
    def pipeline_parallel_rank(self) -> int:
        """Refused, as in Accelerate: pipeline parallelism is not supported."""
        raise NotImplementedError("pipeline parallelism is not supported by nb_accel")

    @contextlib.contextmanager
    def maybe_context_parallel(
        self,
        buffers: list[torch.Tensor] | None = None,
        buffer_seq_dims: list[int] | None = None,
        no_restore_buffers: set[torch.Tensor] | None = None,
    ) -> Iterator[None]:
        """A block that would split ``buffers`` along their sequence dimensions for context
        parallelism; without it (nb_accel runs none, as Accelerate without ``cp_size > 1``) it
        leaves them whole."""
        del buffers, buffer_seq_dims, no_restore_buffers
        yield

    @property
    def multi_device(self) -> bool:
        """True when several processes run data parallel on accelerators (GPUs), as in
        Accelerate (False on CPU processes and under FSDP)."""
        return self._partial.num_processes > 1 and self.distributed_type in _MULTI_DEVICE

    @property
    def is_composable_parallelism_enabled(self) -> bool:
        """True when the models are sharded with FSDP2 (as in Accelerate)."""
        return self.is_fsdp2

    @property
    def deepspeed_plugin(self) -> None:
        """None: nb_accel does not run DeepSpeed."""
        return None

    def verify_device_map(self, model: torch.nn.Module) -> bool:
        """True when ``model`` (or a module in it) was dispatched over several devices with a
        device map (``hf_device_map``), which training on every process cannot take."""
        return any(len(getattr(m, "hf_device_map", None) or ()) > 1 for m in model.modules())

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
            device_type=self._partial.device_type,
            local_process_index=self._partial.local_process_index,
            distributed_type=self._partial.distributed_type,
            mixed_precision=mixed_precision,
            handlers=self._handlers,
            optimizers=self._optimizers,
            changed=self._sharded,
        )
