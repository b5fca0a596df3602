"""The enums Accelerate places in ``accelerate.utils``: mixed-precision modes, trackers, the
kind of distributed setup (``DistributedType``, which ``runtime/state.py`` fills in) and where
the training runs (``ComputeEnvironment``, ``SageMakerDistributedType``)."""

from __future__ import annotations

import enum

__all__ = [
    "ComputeEnvironment",
    "DistributedType",
    "LoggerType",
    "PrecisionType",
    "SageMakerDistributedType",
]


class _ContainsValues(enum.EnumMeta):
    """An enum metaclass whose ``in`` also accepts a member's value: ``"fp16" in PrecisionType``."""

    def __contains__(cls, item: object) -> bool:
        try:
            cls(item)
        except ValueError:
            return False
        return True


class _NamedEnum(enum.Enum, metaclass=_ContainsValues):
    """An enum whose ``str()`` is its value, with ``list()`` of every value."""

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def list(cls) -> list[str]:
        """Every member's value, in definition order."""
        return [str(member) for member in cls]


class PrecisionType(str, _NamedEnum):
    """The mixed-precision modes Accelerate names (``Accelerator(mixed_precision=...)``)."""

    NO = "no"
    FP8 = "fp8"
    FP16 = "fp16"
    BF16 = "bf16"


class LoggerType(_NamedEnum):
    """The experiment trackers Accelerate names (``Accelerator(log_with=...)``)."""

    ALL = "all"
    AIM = "aim"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    TRACKIO = "trackio"
    COMETML = "comet_ml"
    MLFLOW = "mlflow"
    CLEARML = "clearml"
    DVCLIVE = "dvclive"
    SWANLAB = "swanlab"


class DistributedType(str, enum.Enum):
    """The kind of distributed setup the current process runs in.

    nb_accel runs ``NO``, ``MULTI_CPU``, ``MULTI_GPU`` and ``XLA``; the other members exist so
    that code written for Accelerate (``if state.distributed_type == DistributedType.DEEPSPEED``)
    runs unchanged, and never match here.
    """

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_XPU = "MULTI_XPU"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    XLA = "XLA"
    MEGATRON_LM = "MEGATRON_LM"
    MULTI_HPU = "MULTI_HPU"
    MULTI_NEURON = "MULTI_NEURON"


class ComputeEnvironment(str, enum.Enum):
    """Where Accelerate's configuration says the training runs. nb_accel runs on
    ``LOCAL_MACHINE`` (this machine, or the hosts it reaches); ``AMAZON_SAGEMAKER`` is there
    for code that names it."""

    LOCAL_MACHINE = "LOCAL_MACHINE"
    AMAZON_SAGEMAKER = "AMAZON_SAGEMAKER"


class SageMakerDistributedType(str, enum.Enum):
    """SageMaker's kinds of distributed training, as Accelerate names them (nb_accel does not
    launch on SageMaker: the members are there for code that names them)."""

    NO = "NO"
    DATA_PARALLEL = "DATA_PARALLEL"
    MODEL_PARALLEL = "MODEL_PARALLEL"
