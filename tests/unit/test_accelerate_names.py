"""Accelerate's names and import paths exist under ``nb_accel``: renaming the package is the
whole migration."""

from __future__ import annotations

import json

import pytest

import nb_accel
from nb_accel.utils import DistributedType, LoggerType, PrecisionType

#: Every member of Accelerate 1.15's enums, with its value.
DISTRIBUTED_TYPES = [
    "NO",
    "MULTI_CPU",
    "MULTI_GPU",
    "MULTI_NPU",
    "MULTI_MLU",
    "MULTI_SDAA",
    "MULTI_MUSA",
    "MULTI_XPU",
    "DEEPSPEED",
    "FSDP",
    "XLA",
    "MEGATRON_LM",
    "MULTI_HPU",
    "MULTI_NEURON",
]
PRECISIONS = {"NO": "no", "FP8": "fp8", "FP16": "fp16", "BF16": "bf16"}
LOGGERS = {
    "ALL": "all",
    "AIM": "aim",
    "TENSORBOARD": "tensorboard",
    "WANDB": "wandb",
    "TRACKIO": "trackio",
    "COMETML": "comet_ml",
    "MLFLOW": "mlflow",
    "CLEARML": "clearml",
    "DVCLIVE": "dvclive",
    "SWANLAB": "swanlab",
}


@pytest.mark.parametrize("name", DISTRIBUTED_TYPES)
def test_every_distributed_type_accelerate_has_exists_with_its_value(name: str) -> None:
    member = getattr(DistributedType, name)
    assert member.value == name and member == name
    assert nb_accel.DistributedType is DistributedType


def test_a_guard_for_a_setup_nb_accel_does_not_run_is_false() -> None:
    state = nb_accel.PartialState()
    assert state.distributed_type != DistributedType.DEEPSPEED
    assert state.distributed_type not in (DistributedType.FSDP, DistributedType.MEGATRON_LM)
    assert json.dumps(DistributedType.FSDP) == '"FSDP"'


def test_precision_and_logger_types_match_accelerate() -> None:
    assert {m.name: m.value for m in PrecisionType} == PRECISIONS
    assert {m.name: m.value for m in LoggerType} == LOGGERS
    assert PrecisionType.BF16 == "bf16" and str(PrecisionType.FP16) == "fp16"
    assert "fp16" in PrecisionType and "int3" not in PrecisionType
    assert str(LoggerType.WANDB) == "wandb" and "tensorboard" in LoggerType
    assert LoggerType.list() == list(LOGGERS.values())
    assert PrecisionType.list() == list(PRECISIONS.values())
