"""Kernel side: start, watch and stop worker groups (never initialises CUDA)."""

from .launcher import debug_launcher, notebook_launcher

__all__ = ["notebook_launcher", "debug_launcher"]
