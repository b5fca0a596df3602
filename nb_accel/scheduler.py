"""``nb_accel.scheduler``: where Accelerate's ``accelerate.scheduler`` names are."""

from .runtime.training.scheduler import AcceleratedScheduler

__all__ = ["AcceleratedScheduler"]
