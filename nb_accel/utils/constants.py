"""``nb_accel.utils.constants``: the file names Accelerate's documentation lists under
``accelerate.utils`` (those ``save_state`` and ``save_model`` write), and the first releases of
torch, transformers and DeepSpeed with tensor, context and sequence parallelism, by
Accelerate's names (code that checks versions before using them reads these)."""

from ..runtime.checkpoint.contents import (
    MODEL_NAME,
    OPTIMIZER_NAME,
    RNG_STATE_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
)
from ..runtime.checkpoint.model_files import (
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
)

BETA_TP_AVAILABLE_PYTORCH_VERSION = "2.3.0"
"""torch's first release with tensor parallelism (``parallelize_module`` on a device mesh)."""
BETA_TP_AVAILABLE_TRANSFORMERS_VERSION = "4.52.0"
"""transformers' first release whose models take ``tp_plan="auto"`` on a device mesh."""
BETA_CP_AVAILABLE_PYTORCH_VERSION = "2.6.0"
"""torch's first release with context parallelism (``context_parallel``)."""
BETA_SP_AVAILABLE_DEEPSPEED_VERSION = "0.18.2"
"""DeepSpeed's first release with its sequence parallelism (Ulysses, ALST)."""

__all__ = [
    "BETA_CP_AVAILABLE_PYTORCH_VERSION",
    "BETA_SP_AVAILABLE_DEEPSPEED_VERSION",
    "BETA_TP_AVAILABLE_PYTORCH_VERSION",
    "BETA_TP_AVAILABLE_TRANSFORMERS_VERSION",
    "MODEL_NAME",
    "OPTIMIZER_NAME",
    "RNG_STATE_NAME",
    "SAFE_WEIGHTS_INDEX_NAME",
    "SAFE_WEIGHTS_NAME",
    "SCALER_NAME",
    "SCHEDULER_NAME",
    "WEIGHTS_INDEX_NAME",
    "WEIGHTS_NAME",
]
