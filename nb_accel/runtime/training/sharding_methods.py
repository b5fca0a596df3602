"""The Accelerator's sharding side: which strategy prepares its models (``runtime/sharding/``),
and what a model and an optimizer need from it when they are prepared."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from ..fsdp.plugin import FullyShardedDataParallelPlugin
from ..parallelism import ParallelismConfig, mesh_rank
from ..parallelism.context import context_parallel_block
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
    def torch_device_mesh(self) -> Any:
        """The device mesh of the :class:`ParallelismConfig` (torch's ``DeviceMesh``, its
        dimensions named ``dp_replicate``, ``dp_shard``, ``tp``, ... and the flattened ``dp``,
        ``dp_shard_cp``, ``dp_cp``); None without a configuration or with one process."""
        return getattr(self.state, "device_mesh", None)

    def _rank_along(self, what: str, dimension: str) -> int:
        config = self._configured(what)
        mesh = self.torch_device_mesh
        if mesh is None or config._sizes[dimension] == 1:
            return 0
        return mesh_rank(mesh, dimension)

    @property
    def data_parallel_rank(self) -> int:
        """This process's index among the model's replicas (``dp_replicate``); 0 without
        replicas."""
        return self._rank_along("Data parallelism", "dp_replicate")

    @property
    def data_parallel_shard_rank(self) -> int:
        """This process's index among the model's FSDP2 shards (``dp_shard``); 0 when the
        models are not sharded."""
        return self._rank_along("Shard-based data parallelism", "dp_shard")

    @property
    def tensor_parallel_rank(self) -> int:
        """This process's index along the ``tp`` dimension; 0 without tensor parallelism."""
        return self._rank_along("Tensor parallelism", "tp")

    @property
    def context_parallel_rank(self) -> int:
        """This process's index along the ``cp`` dimension; 0 without context parallelism."""
        return self._rank_along("Context parallelism", "cp")

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
        """With context parallelism (``ParallelismConfig(cp_size=n)``, CUDA GPUs), a block in
        which ``buffers`` (inputs, labels, position ids: made anew for each step) are cut along
        their sequence dimensions (``buffer_seq_dims``) over the ``cp`` ranks and attention
        runs as torch's ring attention; after it they are whole again, but
        ``no_restore_buffers``. Without it the block leaves them whole, as in Accelerate."""
        config, mesh = self.parallelism_config, self.torch_device_mesh
        if config is None or not config.cp_enabled or mesh is None:
            yield
            return
        handler = config.cp_handler  # made with cp_size > 1
        strategy = str(getattr(handler, "cp_comm_strategy", None) or "allgather")
        with context_parallel_block(
            mesh["cp"], strategy, buffers, buffer_seq_dims, no_restore_buffers
        ):
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

    def _shard_mesh(self) -> Any:
        """The mesh FSDP2 shards over: the :class:`ParallelismConfig`'s ``dp_replicate`` and
        ``dp_shard_cp`` dimensions (HSDP when both), or None (every process, one dimension)."""
        config, mesh = self.parallelism_config, self.torch_device_mesh
        if config is None or mesh is None or not config.dp_shard_cp_dim_names:
            return None
        shards = config.dp_shard_cp_dim_names
        # one dimension: sliced by its own name (torch is retiring slices by flattened names)
        names = [n for n in config.fsdp_dim_names if n != "dp_shard_cp"]
        names.append(shards[0] if len(shards) == 1 else "dp_shard_cp")
        return mesh[tuple(names)]

    def _batch_mesh(self) -> Any:
        """The device mesh when ranks share batches (a ``tp`` dimension), for the loaders to
        shard over the data-parallel ranks only; None when every rank is one."""
        config = self.parallelism_config
        if config is None or config._sizes["tp"] * config._sizes["cp"] == 1:
            return None
        return self.torch_device_mesh

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
            mesh=self._shard_mesh(),
            tp_size=self.parallelism_config._sizes["tp"] if self.parallelism_config else 1,
            cp_size=self.parallelism_config._sizes["cp"] if self.parallelism_config else 1,
        )
