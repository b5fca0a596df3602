"""🤗 Accelerate's own ``Accelerator()`` in a launch on two GPUs (skipped with fewer): MULTI_GPU on
the launch's NCCL group, rank ``i`` on ``cuda:i``, the launch's mixed precision."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nb_accel import notebook_launcher
from nb_accel.runtime.device_types import cuda_facts

accelerate = pytest.importorskip("accelerate")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(cuda_facts.cuda_device_count() < 2, reason="needs two CUDA GPUs"),
    pytest.mark.timeout(300),
]


def describe_state() -> dict[str, Any]:
    accelerator = accelerate.Accelerator()
    rank = torch.tensor([accelerator.process_index], device=accelerator.device)
    return {
        "type": accelerator.distributed_type.value,
        "num_processes": accelerator.num_processes,
        "device": str(accelerator.device),
        "current": torch.cuda.current_device(),
        "mixed_precision": accelerator.mixed_precision,
        "gathered": accelerator.gather(rank).tolist(),
    }


def test_accelerate_s_accelerator_uses_the_launch_s_gpus() -> None:
    results = notebook_launcher(describe_state, num_processes=2, mixed_precision="fp16")
    for rank, state in enumerate(results):
        assert state["type"] == "MULTI_GPU" and state["num_processes"] == 2
        assert state["device"] == f"cuda:{rank}" and state["current"] == rank
        assert state["mixed_precision"] == "fp16"
        assert state["gathered"] == [0, 1]
