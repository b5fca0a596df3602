"""The process group's backend for FSDP's CPU offload: NCCL with gloo for CPU tensors beside it
wherever the shards may be offloaded, decided without a GPU (the launch plan, the group an
``Accelerator`` creates under torchrun) and refused where the group cannot do it."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from plans import plan_of

from nb_accel import FullyShardedDataParallelPlugin
from nb_accel.launch.workers import worker_env
from nb_accel.runtime.device_backends.torch_distributed import TorchDistributedBackend
from nb_accel.runtime.device_types import cuda_facts
from nb_accel.runtime.device_types.group_backends import (
    backend_for,
    backends_by_device,
    new_group_backend,
    uses_nccl,
    with_cpu_backend,
)
from nb_accel.runtime.fsdp.sharding import _offload_policy
from nb_accel.worker.process.spec import WorkerArgs

pytestmark = pytest.mark.timeout(60)

MAPPED = "cuda:nccl,cpu:gloo"


def test_backend_strings() -> None:
    assert backends_by_device("nccl") == {"cuda": "nccl"}
    assert backends_by_device(MAPPED) == {"cuda": "nccl", "cpu": "gloo"}
    assert backends_by_device(None) == {} and backends_by_device("something-new") == {}
    assert with_cpu_backend("nccl") == MAPPED  # Accelerate's string, in its order
    assert with_cpu_backend(MAPPED) == MAPPED and with_cpu_backend("gloo") == "gloo"
    assert backend_for(MAPPED, "cpu") == "gloo" and backend_for("nccl", "cpu") is None
    assert uses_nccl("nccl") and uses_nccl(MAPPED) and not uses_nccl("gloo")
    assert new_group_backend(cuda=True, cpu_offload=False) == "nccl"
    assert new_group_backend(cuda=True, cpu_offload=True) == MAPPED
    assert new_group_backend(cuda=False, cpu_offload=True) == "gloo"


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two GPUs as far as the launch plan can tell (it reads NVML, never CUDA)."""
    monkeypatch.setattr(cuda_facts, "cuda_device_count", lambda: 2)
    monkeypatch.delenv("FSDP_OFFLOAD_PARAMS", raising=False)


def _backend(sharding: str, cpu: bool = False) -> str:
    return plan_of(num_processes=2, start_method="spawn", cpu=cpu, sharding=sharding).backend


@pytest.mark.usefixtures("two_gpus")
def test_an_fsdp_launch_on_gpus_gets_gloo_beside_nccl(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _backend("ddp") == "nccl"
    assert _backend("fsdp") == MAPPED  # the function's plugin may offload: the launch can't see
    assert _backend("fsdp", cpu=True) == "gloo"
    monkeypatch.setenv("FSDP_OFFLOAD_PARAMS", "true")  # Accelerate's variable, in the kernel
    assert _backend("ddp") == MAPPED
    monkeypatch.setenv("FSDP_OFFLOAD_PARAMS", "false")
    assert _backend("ddp") == "nccl"
    monkeypatch.setenv("FSDP_OFFLOAD_PARAMS", "perhaps")
    with pytest.raises(ValueError, match="FSDP_OFFLOAD_PARAMS='perhaps'"):
        _backend("ddp")


@pytest.mark.usefixtures("two_gpus")
def test_the_workers_join_a_group_with_the_planned_backend() -> None:
    plan = plan_of(num_processes=2, start_method="spawn", cpu=False, sharding="fsdp")
    assert plan.describe().startswith(f"Launching 2 processes on 2 GPUs ({MAPPED}; spawn")
    args = WorkerArgs(
        0, 0, 2, 2, 0, "store", plan.backend, "cuda", 60.0, "no", b"", 1, env=worker_env(plan)
    )
    assert args.rank_environment()["NB_ACCEL_BACKEND"] == MAPPED


def _torchrun_backend(monkeypatch: pytest.MonkeyPatch, **options: Any) -> str:
    """The backend ``PartialState`` creates the group with under torchrun, on two GPUs."""
    made: list[str] = []
    monkeypatch.setattr(cuda_facts, "cuda_device_count", lambda: 2)
    monkeypatch.delenv("NB_ACCEL_USE_CPU", raising=False)
    monkeypatch.delenv("NB_ACCEL_BACKEND", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **_: made.append(backend))
    fields = TorchDistributedBackend(None).rank_fields(False, options)  # type: ignore[arg-type]
    assert fields["device"] == torch.device("cuda", 0) and fields["num_processes"] == 2
    return made[0]


def test_under_torchrun_an_offloading_plugin_gets_gloo_beside_nccl(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    monkeypatch.delenv("FSDP_OFFLOAD_PARAMS", raising=False)
    assert _torchrun_backend(monkeypatch) == "nccl"
    offloading = FullyShardedDataParallelPlugin(cpu_offload=True)
    assert _torchrun_backend(monkeypatch, fsdp_plugin=offloading) == MAPPED
    plain = FullyShardedDataParallelPlugin()
    assert _torchrun_backend(monkeypatch, fsdp_plugin=plain) == "nccl"
    assert _torchrun_backend(monkeypatch, backend="nccl", fsdp_plugin=offloading) == "nccl"
    monkeypatch.setenv("FSDP_OFFLOAD_PARAMS", "1")  # Accelerate's rule: both variables
    assert _torchrun_backend(monkeypatch) == "nccl"
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    assert _torchrun_backend(monkeypatch) == MAPPED


def test_offload_on_a_group_without_a_cpu_backend_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torch.distributed.fsdp import CPUOffloadPolicy

    plugin = FullyShardedDataParallelPlugin(cpu_offload=True)
    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    with pytest.raises(ValueError, match=r"runs 'nccl' only.*fsdp=True") as info:
        _offload_policy(plugin, gpu)
    assert "FSDP_OFFLOAD_PARAMS=true" in str(info.value)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: MAPPED)
    assert isinstance(_offload_policy(plugin, gpu), CPUOffloadPolicy)
    mine = CPUOffloadPolicy(pin_memory=False)
    assert _offload_policy(FullyShardedDataParallelPlugin(cpu_offload=mine), gpu) is mine
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    assert type(_offload_policy(FullyShardedDataParallelPlugin(), gpu)).__name__ == (
        "OffloadPolicy"
    )  # no offload asked: NCCL alone is enough
