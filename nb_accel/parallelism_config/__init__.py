"""``nb_accel.parallelism_config``: where Accelerate's ``accelerate.parallelism_config`` names
are (:class:`ParallelismConfig` and the options classes it names)."""

from ..runtime.parallelism import (
    ParallelismConfig,
    TorchContextParallelConfig,
    TorchTensorParallelConfig,
)

__all__ = ["ParallelismConfig", "TorchContextParallelConfig", "TorchTensorParallelConfig"]
