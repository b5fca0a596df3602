"""Accelerate's names and import paths exist under ``nb_accel``: renaming the package is the
whole migration."""

from __future__ import annotations

import importlib
import json
import logging

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


#: Accelerate's import paths and the nb_accel names they must give (the same objects).
PATHS = {
    "nb_accel.data_loader": {
        "DataLoaderShard": "nb_accel.runtime.data.loaders",
        "DataLoaderDispatcher": "nb_accel.runtime.data.loaders",
        "SkipDataLoader": "nb_accel.runtime.data.loaders",
        "prepare_data_loader": "nb_accel.runtime.data.loaders",
        "skip_first_batches": "nb_accel.runtime.data.loaders",
        "BatchSamplerShard": "nb_accel.runtime.data.sampling",
        "IterableDatasetShard": "nb_accel.runtime.data.sampling",
        "SeedableRandomSampler": "nb_accel.runtime.data.sampling",
        "SkipBatchSampler": "nb_accel.runtime.data.sampling",
    },
    "nb_accel.state": {
        name: "nb_accel.runtime.state"
        for name in ("PartialState", "AcceleratorState", "GradientState", "DistributedType")
    },
    "nb_accel.optimizer": {"AcceleratedOptimizer": "nb_accel.runtime.training.optimizer"},
    "nb_accel.scheduler": {"AcceleratedScheduler": "nb_accel.runtime.training.scheduler"},
    "nb_accel.logging": {
        "get_logger": "nb_accel.runtime.reporting.logger",
        "MultiProcessAdapter": "nb_accel.runtime.reporting.logger",
    },
}


@pytest.mark.parametrize("path", PATHS)
def test_accelerates_import_paths_give_nb_accels_objects(path: str) -> None:
    module = importlib.import_module(path)
    for name, home in PATHS[path].items():
        assert getattr(module, name) is getattr(importlib.import_module(home), name), name
    assert sorted(module.__all__) == sorted(PATHS[path])


def test_get_logger_is_a_logger_adapter_on_the_named_logger() -> None:
    from nb_accel.logging import get_logger

    root_level = logging.getLogger().level
    logger = get_logger("nb_accel_test_adapter", log_level="debug")
    try:
        assert isinstance(logger, logging.LoggerAdapter)
        assert logger.logger is logging.getLogger("nb_accel_test_adapter")
        assert logger.logger.level == logging.DEBUG
    finally:
        logger.logger.setLevel(logging.NOTSET)
        logging.getLogger().setLevel(root_level)
