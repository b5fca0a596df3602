"""``nb_accel.state``: where Accelerate's ``accelerate.state`` names are."""

from .runtime.state import AcceleratorState, DistributedType, GradientState, PartialState

__all__ = ["AcceleratorState", "DistributedType", "GradientState", "PartialState"]
