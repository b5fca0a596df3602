"""Worker side: state, the Accelerator and the worker entrypoint (no IPython here)."""

from .accelerator import Accelerator
from .state import AcceleratorState, DistributedType, PartialState

__all__ = ["Accelerator", "AcceleratorState", "DistributedType", "PartialState"]
