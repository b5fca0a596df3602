"""``nb_accel.utils.versions``: where ``accelerate.utils.versions`` names are (comparing the
versions of torch and of other installed libraries)."""

from ..runtime.environment import compare_versions, is_torch_version

__all__ = ["compare_versions", "is_torch_version"]
