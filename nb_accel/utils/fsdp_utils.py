"""``nb_accel.utils.fsdp_utils``: where ``accelerate.utils.fsdp_utils`` has its FSDP helpers."""

from ..runtime.checkpoint.sharded_files import merge_fsdp_weights

__all__ = ["merge_fsdp_weights"]
