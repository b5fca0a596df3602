"""Warm workers: the kernel's kept pool, which launches with ``reuse_workers=True`` and
``%%distributed`` cells share, and the launch backend that runs a launch on it."""
