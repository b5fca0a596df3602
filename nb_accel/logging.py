"""``nb_accel.logging``: where Accelerate's ``accelerate.logging`` names are."""

from .worker.reporting.logger import MultiProcessAdapter, get_logger

__all__ = ["MultiProcessAdapter", "get_logger"]
