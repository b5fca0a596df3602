"""``nb_accel.accelerator``: where ``accelerate.accelerator`` names are."""

from .runtime.accelerator import Accelerator
from .runtime.options import (
    DataLoaderConfiguration,
    GradientAccumulationPlugin,
    ProjectConfiguration,
)
from .runtime.state import AcceleratorState, GradientState, PartialState

__all__ = [
    "Accelerator",
    "AcceleratorState",
    "DataLoaderConfiguration",
    "GradientAccumulationPlugin",
    "GradientState",
    "PartialState",
    "ProjectConfiguration",
]
