"""``nb_accel.optimizer``: where Accelerate's ``accelerate.optimizer`` names are."""

from .runtime.training.optimizer import AcceleratedOptimizer

__all__ = ["AcceleratedOptimizer"]
