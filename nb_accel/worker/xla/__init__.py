"""The worker main of a launch on XLA devices, started by ``torch_xla``'s ``xmp.spawn``."""
