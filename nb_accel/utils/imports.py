"""``nb_accel.utils.imports``: where ``accelerate.utils.imports`` names are (what is installed
and which devices torch can use)."""

from ..runtime.environment import (
    is_bf16_available,
    is_cuda_available,
    is_datasets_available,
    is_fp16_available,
    is_hpu_available,
    is_mlflow_available,
    is_mps_available,
    is_npu_available,
    is_pytest_available,
    is_rich_available,
    is_tensorboard_available,
    is_torch_xla_available,
    is_torchdata_available,
    is_torchdata_stateful_dataloader_available,
    is_transformers_available,
    is_wandb_available,
    is_xpu_available,
)

__all__ = [
    "is_bf16_available",
    "is_cuda_available",
    "is_datasets_available",
    "is_fp16_available",
    "is_hpu_available",
    "is_mlflow_available",
    "is_mps_available",
    "is_npu_available",
    "is_pytest_available",
    "is_rich_available",
    "is_tensorboard_available",
    "is_torch_xla_available",
    "is_torchdata_available",
    "is_torchdata_stateful_dataloader_available",
    "is_transformers_available",
    "is_wandb_available",
    "is_xpu_available",
]
