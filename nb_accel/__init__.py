"""nb_accel: launch distributed PyTorch training from a notebook cell."""

from .errors import (
    CollectiveTimeoutError,
    LaunchError,
    NbAccelError,
    WorkerDiedError,
    WorkerError,
    WorkerFailure,
)
from .launch import debug_launcher, notebook_launcher
from .runtime import Accelerator, AcceleratorState, DistributedType, PartialState

__version__ = "0.1.0"

__all__ = [
    "Accelerator",
    "AcceleratorState",
    "CollectiveTimeoutError",
    "DistributedType",
    "LaunchError",
    "NbAccelError",
    "PartialState",
    "WorkerDiedError",
    "WorkerError",
    "WorkerFailure",
    "debug_launcher",
    "notebook_launcher",
]
