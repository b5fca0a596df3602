"""``nb_accel.utils.dataclasses``: where ``accelerate.utils.dataclasses`` names are (options,
plugins, kwargs handlers and enums)."""

from ..runtime.data.rng import RNGType
from ..runtime.enums import LoggerType, PrecisionType
from ..runtime.options import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    ProfileKwargs,
    ProjectConfiguration,
)
from ..runtime.state import DistributedType

__all__ = [
    "AutocastKwargs",
    "DataLoaderConfiguration",
    "DDPCommunicationHookType",
    "DistributedDataParallelKwargs",
    "DistributedType",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "LoggerType",
    "PrecisionType",
    "ProfileKwargs",
    "ProjectConfiguration",
    "RNGType",
]
