"""``nb_accel.utils.modeling``: where ``accelerate.utils.modeling`` names are."""

from ..runtime.checkpoint.model_io import load_checkpoint_in_model

__all__ = ["load_checkpoint_in_model"]
