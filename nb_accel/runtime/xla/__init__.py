"""The XLA (TPU) path in the workers: everything that imports ``torch_xla``."""
