"""Kernel side: start, watch and stop worker groups (never initialises CUDA)."""

from .launcher import debug_launcher, notebook_launcher
from .warm.kept import stop_workers

__all__ = ["notebook_launcher", "debug_launcher", "stop_workers"]
