"""``nb_accel.utils.dataclasses``: where ``accelerate.utils.dataclasses`` names are (options,
plugins, kwargs handlers and enums; the engines nb_accel does not run are refused when made),
and ``ParallelismConfig``, which ``accelerate.utils`` exports too."""

from ..runtime.data.rng import RNGType
from ..runtime.engines import (
    DeepSpeedPlugin,
    FP8RecipeKwargs,
    MegatronLMPlugin,
    TorchTensorParallelPlugin,
)
from ..runtime.enums import (
    ComputeEnvironment,
    LoggerType,
    PrecisionType,
    SageMakerDistributedType,
)
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
from ..runtime.parallelism import (
    ParallelismConfig,
    TorchContextParallelConfig,
    TorchTensorParallelConfig,
)
from ..runtime.state import DistributedType
from ..runtime.training.compile import DynamoBackend, TorchDynamoPlugin

__all__ = [
    "AutocastKwargs",
    "ComputeEnvironment",
    "DataLoaderConfiguration",
    "DDPCommunicationHookType",
    "DeepSpeedPlugin",
    "DistributedDataParallelKwargs",
    "DistributedType",
    "DynamoBackend",
    "FP8RecipeKwargs",
    "FullyShardedDataParallelPlugin",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "InitProcessGroupKwargs",
    "KwargsHandler",
    "LoggerType",
    "MegatronLMPlugin",
    "ParallelismConfig",
    "PrecisionType",
    "ProfileKwargs",
    "ProjectConfiguration",
    "RNGType",
    "SageMakerDistributedType",
    "TorchContextParallelConfig",
    "TorchDynamoPlugin",
    "TorchTensorParallelConfig",
    "TorchTensorParallelPlugin",
]
