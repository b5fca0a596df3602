"""Accelerate's ``ParallelismConfig`` on nb_accel: the configuration (:mod:`.config`), and its
fitting to a run (:mod:`.fitting`)."""

from __future__ import annotations

from ..._flags import env_flag
from .config import ParallelismConfig, TorchContextParallelConfig, TorchTensorParallelConfig
from .fitting import fit_to_run, mesh_rank

__all__ = [
    "ParallelismConfig",
    "TorchContextParallelConfig",
    "TorchTensorParallelConfig",
    "fit_to_run",
    "mesh_rank",
    "parallelism_from_environment",
]


def parallelism_from_environment(given: ParallelismConfig | None) -> ParallelismConfig | None:
    """``given``, or, when ``ACCELERATE_USE_PARALLELISM_CONFIG`` is true (``accelerate
    launch`` sets it), a configuration built from the ``PARALLELISM_CONFIG_*`` variables."""
    if given is not None:
        return given
    if env_flag("ACCELERATE_USE_PARALLELISM_CONFIG", default=False):
        return ParallelismConfig()
    return None
