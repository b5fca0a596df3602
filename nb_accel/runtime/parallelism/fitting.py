"""A ``ParallelismConfig`` on a run: its sizes fitted to the processes, what nb_accel cannot
run refused before any training, and a process's place along a dimension of its mesh."""

from __future__ import annotations

from typing import Any

from ..device_types import DeviceType
from .config import ParallelismConfig

__all__ = ["fit_to_run", "mesh_rank"]


def mesh_rank(mesh: Any, dimension: str) -> int:
    """This process's index along ``dimension`` of ``mesh``."""
    return int(mesh.get_local_rank(dimension))


def fit_to_run(
    config: ParallelismConfig, num_processes: int, sharded: bool, device_type: DeviceType
) -> None:
    """Check ``config`` against a run of ``num_processes`` on ``device_type``'s devices, before
    any training. A configuration left at 1 gets the dimension that runs (``dp_shard`` when
    the models are ``sharded``, else ``dp_replicate``) set to ``num_processes``; any other
    product must equal it. What nb_accel does not run is refused here."""
    if config.total_size == 1 and num_processes > 1:
        config._set_size("dp_shard" if sharded else "dp_replicate", num_processes)
    elif config.total_size != num_processes:
        raise ValueError(
            f"ParallelismConfig spans {config.total_size} processes ({_sizes(config)}) but this "
            f"run has {num_processes}: make the product of the sizes {num_processes}"
        )
    if config.sp_enabled:
        raise NotImplementedError(
            f"ParallelismConfig(sp_size={config.sp_size}): sequence parallelism is DeepSpeed's "
            "(Ulysses), which nb_accel does not run; use cp_size for torch's context "
            "parallelism, or leave sp_size at 1"
        )
    if config.cp_enabled and not device_type.context_parallel:
        raise ValueError(
            f"ParallelismConfig(cp_size={config.cp_size}): torch's context parallelism runs on "
            f"CUDA GPUs only, and this run is on {device_type.name!r} devices: leave cp_size at "
            "1 there"
        )
    if config.tp_enabled and sharded and not config.dp_shard_enabled:
        raise ValueError(
            f"ParallelismConfig(tp_size={config.tp_size}) with FSDP, but no dimension is left "
            "for FSDP to shard across (dp_shard_size is 1): lower tp_size to leave ranks for "
            "dp_shard_size, or leave FSDP out (fsdp_plugin, the launch's fsdp=True)"
        )
    if config.dp_replicate_enabled and not config.dp_shard_enabled and sharded:
        raise ValueError(
            f"ParallelismConfig(dp_replicate_size={config.dp_replicate_size}) replicates the "
            "models with DistributedDataParallel, but the Accelerator shards them with FSDP2 "
            f"(fsdp_plugin, or the launch's fsdp=True): use dp_shard_size={num_processes}, or "
            "dp_shard_size above 1 with dp_replicate_size for HSDP, or leave FSDP out"
        )


def _sizes(config: ParallelismConfig) -> str:
    used = [f"{d}_size={size}" for d, size in config._sizes.items() if size > 1]
    return " x ".join(used) or "every size 1"
