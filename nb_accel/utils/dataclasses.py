"""``nb_accel.utils.dataclasses``: where ``accelerate.utils.dataclasses`` names are (options,
plugins, kwargs handlers and enums)."""

from ..runtime.data.rng import RNGType
from ..runtime.enums import LoggerType, PrecisionType
from ..runtime.fsdp.plugin import FullyShardedDataParallelPlugin
from ..runtime.options import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    ProfileKwargs,
    ProjectConfiguration,
)
from ..runtime.state import DistributedType
from ..runtime.training.compile import DynamoBackend, TorchDynamoPlugin

__all__ = [
    "AutocastKwargs",
    "DataLoaderConfiguration",
    "DDPCommunicationHookType",
    "DistributedDataParallelKwargs",
    "DistributedType",
    "DynamoBackend",
    "FullyShardedDataParallelPlugin",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "InitProcessGroupKwargs",
    "KwargsHandler",
    "LoggerType",
    "PrecisionType",
    "ProfileKwargs",
    "ProjectConfiguration",
    "RNGType",
    "TorchDynamoPlugin",
]
