"""``nb_accel.utils.other``: where ``accelerate.utils.other`` names are, and the helpers
Accelerate's examples import from ``accelerate.utils`` (``tqdm``, ``write_basic_config``)."""

from ..config import write_basic_config
from ..runtime.checkpoint.methods import load, save
from ..runtime.training.compile import compile_regions, has_compiled_regions, is_compiled_module
from ..runtime.training.model import get_module_children_bottom_up
from ..runtime.training.model import unwrap_model as extract_model_from_parallel
from ..worker.reporting.progress import main_process_tqdm as tqdm


def wait_for_everyone() -> None:
    """Wait until every process reaches this point (``PartialState().wait_for_everyone()``)."""
    from ..runtime.state import PartialState

    PartialState().wait_for_everyone()


__all__ = [
    "compile_regions",
    "extract_model_from_parallel",
    "get_module_children_bottom_up",
    "has_compiled_regions",
    "is_compiled_module",
    "load",
    "save",
    "tqdm",
    "wait_for_everyone",
    "write_basic_config",
]
