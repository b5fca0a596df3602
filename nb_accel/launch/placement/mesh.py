"""The device mesh a launch lays its ranks out on: the sizes of Accelerate's
``ParallelismConfig`` (replicas, FSDP shards, tensor and context parallel groups), checked
against the launch's ranks before anything starts, told to the workers through Accelerate's own
``PARALLELISM_CONFIG_*`` variables (``Accelerator()`` inside builds the mesh from them, as under
``accelerate launch``), and said in the launch's title."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...config import MESH_SIZES, Config
from ...runtime.device_types import DeviceType
from ...runtime.parallelism import ParallelismConfig, fit_to_run

__all__ = ["MeshPlan", "make_mesh_plan", "mesh_sizes"]

#: What the workers' ``Accelerator()`` reads the mesh from (Accelerate's names).
_USE_VARIABLE = "ACCELERATE_USE_PARALLELISM_CONFIG"
_SIZE_VARIABLE = "PARALLELISM_CONFIG_{}"


@dataclass(frozen=True)
class MeshPlan:
    """The dimensions of a launch's mesh that span more than one rank, in the mesh's order
    (empty: no mesh asked for; the sharding strategy alone spreads the model)."""

    sizes: tuple[tuple[str, int], ...] = ()

    def worker_env(self) -> dict[str, str]:
        """Accelerate's variables for the mesh (none without one)."""
        if not self.sizes:
            return {}
        env = {_USE_VARIABLE: "true"}
        for name in MESH_SIZES:
            env[_SIZE_VARIABLE.format(name.upper())] = str(dict(self.sizes).get(name, 1))
        return env

    def describe(self) -> str | None:
        """``"mesh dp_shard 2 x tp 2"``; None without a mesh."""
        if not self.sizes:
            return None
        return "mesh " + " x ".join(f"{n.removesuffix('_size')} {s}" for n, s in self.sizes)


def mesh_sizes(given: object, config: Config) -> dict[str, int]:
    """The sizes asked for: ``given`` (a ``ParallelismConfig``, nb_accel's or Accelerate's,
    or a mapping of sizes), else the saved configuration's; a ``ValueError`` naming what is
    wrong with ``given``."""
    if given is None:
        return {name: getattr(config, name) for name in MESH_SIZES}
    if isinstance(given, Mapping):
        unknown = sorted(set(given) - set(MESH_SIZES))
        if unknown:
            raise ValueError(
                f"parallelism_config has no {', '.join(map(repr, unknown))}: give the sizes "
                f"{', '.join(MESH_SIZES)}"
            )
        values: Mapping[str, Any] = given
    elif all(hasattr(given, name) for name in MESH_SIZES):
        values = {name: getattr(given, name) for name in MESH_SIZES}
    else:
        raise TypeError(
            "parallelism_config must be a ParallelismConfig or a dict of sizes "
            f"({', '.join(MESH_SIZES)}), got {type(given).__name__}"
        )
    sizes = {name: values.get(name, 1) for name in MESH_SIZES}
    for name, size in sizes.items():
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(
                f"parallelism_config: {name} must be a whole number >= 1, got {size!r}"
            )
    if getattr(given, "sp_size", 1) != 1:
        raise NotImplementedError(
            f"parallelism_config: sp_size={given.sp_size} is DeepSpeed's sequence parallelism, "  # type: ignore[attr-defined]
            "which nb_accel does not run; use cp_size, or leave sp_size at 1"
        )
    return sizes


def make_mesh_plan(
    sizes: Mapping[str, int], world_size: int, sharded: bool, device_type: DeviceType
) -> MeshPlan:
    """The mesh of ``sizes`` for a launch of ``world_size`` ranks on ``device_type``'s devices
    (``sharded``: its models are sharded with FSDP2), refused here when the workers'
    ``Accelerator()`` would refuse it."""
    if all(size == 1 for size in sizes.values()):
        return MeshPlan()
    config = ParallelismConfig(
        dp_replicate_size=sizes["dp_replicate_size"],
        dp_shard_size=sizes["dp_shard_size"],
        tp_size=sizes["tp_size"],
        cp_size=sizes["cp_size"],
    )
    fit_to_run(config, world_size, sharded, device_type)
    return MeshPlan(tuple((name, sizes[name]) for name in MESH_SIZES if sizes[name] > 1))
