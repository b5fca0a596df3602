"""Accelerate's ``ParallelismConfig``: how the processes of a launch share the training, along
up to five dimensions of a device mesh.

``dp_replicate`` (whole copies of the model, as DDP), ``dp_shard`` (FSDP2's shards), ``cp``
(context parallel: a sequence split over ranks), ``sp`` (DeepSpeed's sequence parallelism) and
``tp`` (tensor parallel). HSDP is ``dp_replicate`` and ``dp_shard`` together: FSDP2 shards
within each replica group. The sizes, the checks and the mesh (:meth:`build_device_mesh`, its
dimensions in Accelerate's order with the flattened ``dp``, ``dp_shard_cp`` and ``dp_cp``) are
Accelerate's; what nb_accel cannot run yet is refused when an ``Accelerator`` takes the
configuration (:func:`~nb_accel.runtime.parallelism.fitting.fit_to_run`), not when it is made,
so that code which only describes a layout (and Accelerate's own tests of it) runs unchanged.
"""

from __future__ import annotations

import copy
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, cast

__all__ = [
    "MESH_ORDER",
    "ParallelismConfig",
    "TorchContextParallelConfig",
    "TorchTensorParallelConfig",
]

_ENV = "PARALLELISM_CONFIG_"
#: The mesh's dimensions, in the order Accelerate lays them out (the last varies fastest).
MESH_ORDER = ("dp_replicate", "dp_shard", "cp", "sp", "tp")
#: What each dimension is, in words.
_DIMENSIONS = {
    "dp_replicate": "replicated data parallelism",
    "dp_shard": "sharded data parallelism",
    "cp": "context parallelism",
    "sp": "sequence parallelism",
    "tp": "tensor parallelism",
}
_CP_STRATEGIES = ("allgather", "alltoall")


@dataclass
class TorchTensorParallelConfig:
    """Accelerate's options for tensor parallelism: ``enable_async_tp``."""

    enable_async_tp: bool = False


@dataclass
class TorchContextParallelConfig:
    """Accelerate's options for context parallelism: ``cp_comm_strategy`` (``"allgather"``,
    the default, or ``"alltoall"``; ``None`` reads ``PARALLELISM_CONFIG_CP_COMM_STRATEGY``)."""

    cp_comm_strategy: str | None = None

    def __post_init__(self) -> None:
        if self.cp_comm_strategy is None:
            self.cp_comm_strategy = os.environ.get(_ENV + "CP_COMM_STRATEGY", "allgather")
        if self.cp_comm_strategy not in _CP_STRATEGIES:
            raise ValueError(
                f"Invalid cp_comm_strategy: {self.cp_comm_strategy} (cp_comm_strategy="
                f"{self.cp_comm_strategy!r}); use 'allgather' or 'alltoall'"
            )


def _size_from_environment(name: str) -> int:
    text = os.environ.get(_ENV + name.upper(), "1")
    try:
        return int(text)
    except ValueError:
        raise ValueError(
            f"{_ENV}{name.upper()}={text!r} is not a whole number: set it to the size of the "
            f"{name.removesuffix('_size')} dimension (1: unused)"
        ) from None


@dataclass
class ParallelismConfig:
    """How the processes share the training, as in Accelerate: the size of each dimension of
    the device mesh. Sizes left as ``None`` take Accelerate's ``PARALLELISM_CONFIG_*``
    variables, then 1; the product of the sizes is the number of processes.

    - ``dp_replicate_size=N``: N replicas of the model (``DistributedDataParallel``);
    - ``dp_shard_size=N``: the model sharded over N processes (FSDP2, with a default
      ``FullyShardedDataParallelPlugin`` when none is given);
    - both: HSDP, FSDP2 sharding within each of ``dp_replicate_size`` groups;
    - ``tp_size``, ``cp_size``, ``sp_size``: tensor, context and sequence parallelism.

    ``device_mesh`` is the mesh once built (:meth:`get_device_mesh`); an ``Accelerator``
    builds it and shows it as ``accelerator.torch_device_mesh``.
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
    device_mesh: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        for dimension in _DIMENSIONS:
            name = f"{dimension}_size"
            if getattr(self, name) is None:
                setattr(self, name, _size_from_environment(name))
            if getattr(self, name) < 1:
                raise ValueError(
                    f"ParallelismConfig: {name} must be at least 1, not {getattr(self, name)}"
                )
        if self.cp_backend is None:
            self.cp_backend = os.environ.get(_ENV + "CP_BACKEND", "torch")
        if self.sp_backend is None:
            self.sp_backend = os.environ.get(_ENV + "SP_BACKEND", "deepspeed")
        if self.cp_backend != "torch":
            raise ValueError(
                f"ParallelismConfig: cp_backend must be 'torch' (torch's context parallelism), "
                f"not {self.cp_backend!r}"
            )
        if self.sp_backend != "deepspeed":
            raise ValueError(
                f"ParallelismConfig: sp_backend must be 'deepspeed' (DeepSpeed's Ulysses), not "
                f"{self.sp_backend!r}"
            )
        self._default_handlers()
        self._check_combination()

    def _default_handlers(self) -> None:
        if self.tp_enabled and self.tp_handler is None:
            self.tp_handler = TorchTensorParallelConfig()
        if self.cp_enabled:
            if self.cp_handler is None:
                self.cp_handler = TorchContextParallelConfig()
            elif not isinstance(self.cp_handler, TorchContextParallelConfig):
                raise ValueError(
                    f"ParallelismConfig: cp_backend='torch' takes a TorchContextParallelConfig "
                    f"as cp_handler, not {type(self.cp_handler).__name__}"
                )
        for dimension in ("tp", "cp", "sp"):
            if getattr(self, f"{dimension}_size") == 1 and getattr(self, f"{dimension}_handler"):
                warnings.warn(
                    f"ParallelismConfig: {dimension}_handler is ignored ({dimension}_size is 1)",
                    stacklevel=4,
                )

    def _check_combination(self) -> None:
        if self.cp_enabled and self.sp_enabled:
            raise ValueError(
                f"ParallelismConfig(cp_size={self.cp_size}, sp_size={self.sp_size}): context "
                "and sequence parallelism split the same sequence; set one of them to 1"
            )
        if (self.tp_enabled or self.cp_enabled) and self.dp_replicate_enabled:
            if not self.dp_shard_enabled:
                raise ValueError(
                    f"ParallelismConfig(dp_replicate_size={self.dp_replicate_size}, tp_size="
                    f"{self.tp_size}, cp_size={self.cp_size}): tensor or context parallelism "
                    "composes with FSDP2, not with replicas alone: set dp_shard_size above 1 "
                    "(with dp_replicate_size 1 for 2-D parallelism, above 1 for HSDP in 3-D)"
                )

    def __repr__(self) -> str:
        sizes = ", ".join(f"{d}_size={getattr(self, f'{d}_size')}" for d in _DIMENSIONS)
        return f"ParallelismConfig({sizes}, total_size={self.total_size})"

    def to_json(self) -> dict[str, Any]:
        """The configuration as plain values (the mesh left out)."""
        return {
            name: copy.deepcopy(vars(value)) if hasattr(value, "__dict__") else value
            for name, value in vars(self).items()
            if name != "device_mesh" and not name.startswith("_")
        }

    # --- sizes -------------------------------------------------------------------------

    @property
    def _sizes(self) -> dict[str, int]:
        """Each dimension's size, by name (Accelerate's name for it)."""
        return {d: int(getattr(self, f"{d}_size")) for d in _DIMENSIONS}

    def _set_size(self, dimension: str, size: int) -> None:
        """Set one dimension's size (Accelerate's name for it)."""
        if dimension not in _DIMENSIONS:
            raise ValueError(f"no {dimension!r} dimension: one of {', '.join(_DIMENSIONS)}")
        setattr(self, f"{dimension}_size", size)

    @property
    def total_size(self) -> int:
        """The number of processes the configuration spans: the product of the sizes."""
        return self.data_parallel_size * self.non_data_parallel_size

    @property
    def data_parallel_size(self) -> int:
        """``dp_replicate_size * dp_shard_size``."""
        return int(self.dp_replicate_size or 1) * int(self.dp_shard_size or 1)

    @property
    def non_data_parallel_size(self) -> int:
        """``tp_size * cp_size * sp_size``: the ranks that see the same batch."""
        return int(self.tp_size or 1) * int(self.cp_size or 1) * int(self.sp_size or 1)

    @property
    def dp_replicate_enabled(self) -> bool:
        """True when the model is replicated (``dp_replicate_size > 1``)."""
        return int(self.dp_replicate_size or 1) > 1

    @property
    def dp_shard_enabled(self) -> bool:
        """True when the model is sharded with FSDP2 (``dp_shard_size > 1``)."""
        return int(self.dp_shard_size or 1) > 1

    @property
    def tp_enabled(self) -> bool:
        """True when ``tp_size > 1``."""
        return int(self.tp_size or 1) > 1

    @property
    def cp_enabled(self) -> bool:
        """True when ``cp_size > 1``."""
        return int(self.cp_size or 1) > 1

    @property
    def sp_enabled(self) -> bool:
        """True when ``sp_size > 1``."""
        return int(self.sp_size or 1) > 1

    # --- the mesh's dimensions -----------------------------------------------------------

    def _enabled(self, *dimensions: str) -> list[str]:
        return [d for d in dimensions if self._sizes[d] > 1]

    @property
    def dp_dim_names(self) -> list[str]:
        """The data parallel dimensions in use (each sees batches of its own)."""
        return self._enabled("dp_replicate", "dp_shard")

    @property
    def non_dp_dim_names(self) -> list[str]:
        """The dimensions in use whose ranks see the same batch (``tp``, ``cp``, ``sp``)."""
        return self._enabled("tp", "cp", "sp")

    @property
    def dp_shard_cp_dim_names(self) -> list[str]:
        """The dimensions FSDP2 shards over, flattened into ``dp_shard_cp``."""
        return self._enabled("dp_shard", "cp")

    @property
    def dp_cp_dim_names(self) -> list[str]:
        """The dimensions the loss is averaged over, flattened into ``dp_cp``."""
        return self._enabled("dp_replicate", "dp_shard", "cp")

    @property
    def fsdp_dim_names(self) -> list[str]:
        """The mesh FSDP2 is given: ``dp_replicate`` (HSDP's replicas) and ``dp_shard_cp``."""
        return [*self._enabled("dp_replicate"), "dp_shard_cp"]

    @property
    def active_mesh_dims(self) -> list[str]:
        """Every dimension in use: the data parallel ones, then the others."""
        return self.dp_dim_names + self.non_dp_dim_names

    def _get_mesh(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """The mesh's dimension names and shape, in Accelerate's order (empty: none in use)."""
        used = sorted(self.active_mesh_dims, key=MESH_ORDER.index)
        if not used:
            return ()  # type: ignore[return-value]
        return tuple(used), tuple(self._sizes[d] for d in used)

    def build_device_mesh(self, device_type: str) -> Any:
        """A ``torch.distributed`` device mesh of ``device_type`` with the dimensions in use
        (``None`` when none is, or DeepSpeed's sequence parallelism makes its own groups), and
        the flattened ``dp``, ``dp_shard_cp`` and ``dp_cp`` where their parts are in use.
        Every process must call it (it makes the process groups of each dimension)."""
        if self.sp_enabled and self.sp_backend == "deepspeed":
            return None  # DeepSpeed makes its own groups
        from torch.distributed import device_mesh

        layout = self._get_mesh()
        if not layout:
            return None
        names, shape = layout
        mesh = device_mesh.init_device_mesh(device_type, shape, mesh_dim_names=names)
        for flat, parts in (
            ("dp", self.dp_dim_names),
            ("dp_shard_cp", self.dp_shard_cp_dim_names),
            ("dp_cp", self.dp_cp_dim_names),
        ):
            if parts:  # a list, as Accelerate indexes it (torch takes a tuple or a list)
                mesh[cast(Any, parts)]._flatten(flat)  # torch's way of joining dimensions
        return mesh

    def get_device_mesh(self, device_type: str | None = None) -> Any:
        """The mesh, built once for ``device_type``; asking for another type afterwards is a
        ``ValueError``."""
        if self.device_mesh is None:
            if device_type is None:
                raise ValueError(
                    "ParallelismConfig.get_device_mesh: the mesh is not built yet; pass the "
                    "device type to build it on (e.g. 'cuda' or 'cpu')"
                )
            self.device_mesh = self.build_device_mesh(device_type)
        elif device_type is not None and self.device_mesh.device_type != device_type:
            raise ValueError(
                f"ParallelismConfig.get_device_mesh({device_type!r}): the mesh was built on "
                f"{self.device_mesh.device_type!r} devices already"
            )
        return self.device_mesh
