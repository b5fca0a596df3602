"""``nb_accel.utils.modeling``: where ``accelerate.utils.modeling`` names are."""

from ..runtime.checkpoint.model_io import load_checkpoint_in_model
from ..runtime.training.precision import get_grad_scaler, get_mixed_precision_context_manager

__all__ = ["get_grad_scaler", "get_mixed_precision_context_manager", "load_checkpoint_in_model"]
