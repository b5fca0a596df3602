"""Launching on XLA devices (TPUs) through ``torch_xla``'s ``xmp.spawn``."""
