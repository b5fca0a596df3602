"""``nb_accel.utils.other``: where ``accelerate.utils.other`` names are."""

from ..runtime.training.compile import is_compiled_module

__all__ = ["is_compiled_module"]
