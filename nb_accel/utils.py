"""Re-exports of the names Accelerate's documentation places under ``accelerate.utils``.

Replacing ``accelerate`` by ``nb_accel`` in a user's imports is the whole migration.
"""

from .runtime.checkpoint.model_io import load_checkpoint_in_model
from .runtime.data.rng import RNGType, set_seed, synchronize_rng_state, synchronize_rng_states
from .runtime.enums import LoggerType, PrecisionType
from .runtime.environment import (
    clear_environment,
    is_cuda_available,
    is_datasets_available,
    is_mlflow_available,
    is_rich_available,
    is_tensorboard_available,
    is_torch_xla_available,
    is_torchdata_available,
    is_transformers_available,
    is_wandb_available,
    patch_environment,
)
from .runtime.memory import find_executable_batch_size, release_memory, should_reduce_batch_size
from .runtime.ops import (
    DistributedOperationException,
    broadcast,
    broadcast_object_list,
    gather,
    gather_object,
    pad_across_processes,
    reduce,
)
from .runtime.options import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    ProfileKwargs,
    ProjectConfiguration,
)
from .runtime.state import DistributedType
from .runtime.tree import (
    concatenate,
    find_batch_size,
    find_device,
    get_data_structure,
    initialize_tensors,
    recursively_apply,
    send_to_device,
    slice_tensors,
)

__all__ = [
    "clear_environment",
    "is_cuda_available",
    "is_datasets_available",
    "is_mlflow_available",
    "is_rich_available",
    "is_tensorboard_available",
    "is_torch_xla_available",
    "is_torchdata_available",
    "is_transformers_available",
    "is_wandb_available",
    "patch_environment",
    "find_executable_batch_size",
    "release_memory",
    "should_reduce_batch_size",
    "AutocastKwargs",
    "DataLoaderConfiguration",
    "DDPCommunicationHookType",
    "DistributedDataParallelKwargs",
    "DistributedOperationException",
    "DistributedType",
    "GradScalerKwargs",
    "ProfileKwargs",
    "GradientAccumulationPlugin",
    "LoggerType",
    "PrecisionType",
    "ProjectConfiguration",
    "RNGType",
    "broadcast",
    "broadcast_object_list",
    "concatenate",
    "find_batch_size",
    "find_device",
    "gather",
    "gather_object",
    "get_data_structure",
    "load_checkpoint_in_model",
    "initialize_tensors",
    "pad_across_processes",
    "recursively_apply",
    "reduce",
    "send_to_device",
    "set_seed",
    "slice_tensors",
    "synchronize_rng_state",
    "synchronize_rng_states",
]
