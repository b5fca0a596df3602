"""``nb_accel.utils.memory``: where ``accelerate.utils.memory`` names are."""

from ..runtime.memory import find_executable_batch_size, release_memory, should_reduce_batch_size

__all__ = ["find_executable_batch_size", "release_memory", "should_reduce_batch_size"]
