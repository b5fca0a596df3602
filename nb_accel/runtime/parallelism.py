"""Accelerate's ``ParallelismConfig`` on what nb_accel runs: data parallelism over every process
of a launch, replicated (``dp_replicate_size``: ``DistributedDataParallel``) or sharded
(``dp_shard_size``: FSDP2). Tensor, context and sequence parallelism are refused, and their
options classes (``TorchTensorParallelConfig``, ``TorchContextParallelConfig``) are there for
code that names them.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any

from .._flags import env_flag

__all__ = [
    "ParallelismConfig",
    "TorchContextParallelConfig",
    "TorchTensorParallelConfig",
    "parallelism_from_environment",
]

_ENV = "PARALLELISM_CONFIG_"
#: What nb_accel runs, said in every refusal.
_SUPPORTED = (
    "nb_accel runs data parallelism over every process of a launch: dp_replicate_size "
    "(DistributedDataParallel) or dp_shard_size (FSDP2 sharding)"
)
#: The dimensions Accelerate's device mesh has, in its order, with what each one is.
_DIMENSIONS = {
    "dp_replicate": "data parallelism",
    "dp_shard": "sharded data parallelism",
    "cp": "context parallelism",
    "sp": "sequence parallelism",
    "tp": "tensor parallelism",
}


@dataclass
class TorchTensorParallelConfig:
    """Accelerate's options for tensor parallelism: ``enable_async_tp``. nb_accel does not
    run tensor parallelism; a :class:`ParallelismConfig` with ``tp_size > 1`` is refused."""

    enable_async_tp: bool = False


@dataclass
class TorchContextParallelConfig:
    """Accelerate's options for context parallelism: ``cp_comm_strategy`` (``"allgather"``,
    the default, or ``"alltoall"``). nb_accel does not run context parallelism; a
    :class:`ParallelismConfig` with ``cp_size > 1`` is refused."""

    cp_comm_strategy: str | None = None

    def __post_init__(self) -> None:
        if self.cp_comm_strategy is None:
            self.cp_comm_strategy = os.environ.get(_ENV + "CP_COMM_STRATEGY", "allgather")
        if self.cp_comm_strategy not in ("allgather", "alltoall"):
            raise ValueError(
                f"TorchContextParallelConfig: cp_comm_strategy={self.cp_comm_strategy!r}; use "
                "'allgather' or 'alltoall'"
            )


@dataclass
class ParallelismConfig:
    """How the processes of a launch share the training, as in Accelerate; sizes left as
    ``None`` take Accelerate's ``PARALLELISM_CONFIG_*`` variables, then 1.

    ``dp_replicate_size=N`` runs ``DistributedDataParallel`` over the N processes;
    ``dp_shard_size=N`` shards the models over them with FSDP2 (with a default
    ``FullyShardedDataParallelPlugin`` when none is given). Their product is the launch's
    number of processes (left at 1, the ``Accelerator`` sets the one it runs to that number).
    ``tp_size``, ``cp_size`` or ``sp_size`` above 1, and both data parallel sizes above 1 (HSDP),
    are refused with ``NotImplementedError``.
    """

    dp_replicate_size: int | None = None
    dp_shard_size: int | None = None
    tp_size: int | None = None
    cp_size: int | None = None
    cp_backend: str | None = None
    sp_size: int | None = None
    sp_backend: str | None = None
    tp_handler: TorchTensorParallelConfig | None = None
    cp_handler: TorchContextParallelConfig | None = None
    sp_handler: Any = None

    def __post_init__(self) -> None:
        for dimension in _DIMENSIONS:
            name = f"{dimension}_size"
            if getattr(self, name) is None:
                setattr(self, name, int(os.environ.get(_ENV + name.upper(), "1")))
            if getattr(self, name) < 1:
                raise ValueError(
                    f"ParallelismConfig: {name} must be at least 1, not {getattr(self, name)}"
                )
        if self.cp_backend is None:
            self.cp_backend = os.environ.get(_ENV + "CP_BACKEND", "torch")
        if self.sp_backend is None:
            self.sp_backend = os.environ.get(_ENV + "SP_BACKEND", "deepspeed")
        self._refuse_what_nb_accel_does_not_run()

    def _refuse_what_nb_accel_does_not_run(self) -> None:
        for dimension in ("tp", "cp", "sp"):
            size = getattr(self, f"{dimension}_size")
            if size > 1:
                raise NotImplementedError(
                    f"ParallelismConfig({dimension}_size={size}): {_DIMENSIONS[dimension]} is "
                    f"not supported; {_SUPPORTED}. Leave {dimension}_size at 1"
                )
            if getattr(self, f"{dimension}_handler") is not None:
                warnings.warn(
                    f"ParallelismConfig: {dimension}_handler is ignored ({dimension}_size is 1)",
                    stacklevel=4,
                )
        if self.dp_replicate_enabled and self.dp_shard_enabled:
            raise NotImplementedError(
                f"ParallelismConfig(dp_replicate_size={self.dp_replicate_size}, dp_shard_size="
                f"{self.dp_shard_size}): replicating shards across groups (HSDP) is not "
                f"supported; {_SUPPORTED}. Set one of them to the number of processes"
            )

    @property
    def total_size(self) -> int:
        """The number of processes this configuration spans: the product of the sizes."""
        return self.data_parallel_size * self.non_data_parallel_size

    @property
    def data_parallel_size(self) -> int:
        """``dp_replicate_size * dp_shard_size``."""
        return int(self.dp_replicate_size or 1) * int(self.dp_shard_size or 1)

    @property
    def non_data_parallel_size(self) -> int:
        """``tp_size * cp_size * sp_size`` (1: nb_accel runs none of them)."""
        return int(self.tp_size or 1) * int(self.cp_size or 1) * int(self.sp_size or 1)

    @property
    def dp_replicate_enabled(self) -> bool:
        """True when the models are replicated (``DistributedDataParallel``)."""
        return int(self.dp_replicate_size or 1) > 1

    @property
    def dp_shard_enabled(self) -> bool:
        """True when the models are sharded with FSDP2."""
        return int(self.dp_shard_size or 1) > 1

    @property
    def tp_enabled(self) -> bool:
        """Always False: tensor parallelism is refused."""
        return int(self.tp_size or 1) > 1

    @property
    def cp_enabled(self) -> bool:
        """Always False: context parallelism is refused."""
        return int(self.cp_size or 1) > 1

    @property
    def sp_enabled(self) -> bool:
        """Always False: sequence parallelism is refused."""
        return int(self.sp_size or 1) > 1

    @property
    def active_mesh_dims(self) -> list[str]:
        """The dimensions with a size above 1, in Accelerate's order."""
        return [d for d in _DIMENSIONS if int(getattr(self, f"{d}_size") or 1) > 1]

    @property
    def dp_dim_names(self) -> list[str]:
        """The data parallel dimensions with a size above 1."""
        return [d for d in ("dp_replicate", "dp_shard") if d in self.active_mesh_dims]

    def fit_to(self, num_processes: int, sharded: bool) -> None:
        """Check the sizes against the launch's ``num_processes``: a configuration left at 1
        gets the dimension that runs (``dp_shard`` when ``sharded``, else ``dp_replicate``) set
        to ``num_processes``; any other product must equal it."""
        if self.total_size == 1 and num_processes > 1:
            setattr(self, "dp_shard_size" if sharded else "dp_replicate_size", num_processes)
        elif self.total_size != num_processes:
            raise ValueError(
                f"ParallelismConfig spans {self.total_size} processes (dp_replicate_size="
                f"{self.dp_replicate_size} x dp_shard_size={self.dp_shard_size}) but this run "
                f"has {num_processes}: set dp_replicate_size or dp_shard_size to {num_processes}"
            )
        if self.dp_replicate_enabled and sharded:
            raise ValueError(
                f"ParallelismConfig(dp_replicate_size={self.dp_replicate_size}) replicates the "
                "models with DistributedDataParallel, but the Accelerator shards them with FSDP2 "
                f"(fsdp_plugin, or the launch's fsdp=True): use dp_shard_size={num_processes}, or "
                "leave FSDP out"
            )


def parallelism_from_environment(given: ParallelismConfig | None) -> ParallelismConfig | None:
    """``given``, or, when ``ACCELERATE_USE_PARALLELISM_CONFIG`` is true (``accelerate
    launch`` sets it), a configuration built from the ``PARALLELISM_CONFIG_*`` variables."""
    if given is not None:
        return given
    if env_flag("ACCELERATE_USE_PARALLELISM_CONFIG", default=False):
        return ParallelismConfig()
    return None
