"""``nb_accel.utils.environment``: where ``accelerate.utils.environment`` names are."""

from ..runtime.environment import (
    clear_environment,
    patch_environment,
    purge_accelerate_environment,
)

__all__ = ["clear_environment", "patch_environment", "purge_accelerate_environment"]
