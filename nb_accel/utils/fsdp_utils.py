"""``nb_accel.utils.fsdp_utils``: where ``accelerate.utils.fsdp_utils`` has its FSDP helpers."""

from ..runtime.checkpoint.sharded_files import merge_fsdp_weights
from ..runtime.fsdp.plugin import (
    disable_fsdp_ram_efficient_loading,
    enable_fsdp_ram_efficient_loading,
)

__all__ = [
    "disable_fsdp_ram_efficient_loading",
    "enable_fsdp_ram_efficient_loading",
    "merge_fsdp_weights",
]
