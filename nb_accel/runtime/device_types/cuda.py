"""CUDA GPUs (NVIDIA's, and AMD's through ROCm, which torch names ``cuda`` too): one rank per
GPU, collectives through NCCL, devices counted by NVML so that the kernel can still fork."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from ..cuda_origin import first_cuda_call
from ..enums import DistributedType
from . import cuda_facts, nvml
from .gpu_advice import advise
from .group_backends import with_cpu_backend
from .interface import DeviceAdvice, DeviceType, FirstUse

__all__ = ["CudaDevices"]


class CudaDevices(DeviceType):
    """The GPUs ``CUDA_VISIBLE_DEVICES`` leaves visible, one per rank."""

    name: ClassVar[str] = "cuda"
    label: ClassVar[str] = "GPU"
    distributed_type: ClassVar[DistributedType] = DistributedType.MULTI_GPU
    runtime: ClassVar[str] = "CUDA"
    first_calls: ClassVar[str] = ".cuda(), .to('cuda'), torch.cuda.*"
    tracks_first_use: ClassVar[bool] = True

    def visible_count(self) -> int:
        """NVML's count (or, where NVML cannot count, a forked child's)."""
        return cuda_facts.cuda_device_count()

    def group_backend(self, cpu_collectives: bool) -> str:
        """NCCL, with gloo beside it for CPU tensors when asked (``"cuda:nccl,cpu:gloo"``)."""
        return with_cpu_backend("nccl") if cpu_collectives else "nccl"

    def forks_safely(self) -> bool:
        """False once this process initialised CUDA (also in the ways torch does not flag)."""
        return cuda_facts.cuda_works_after_fork()

    def first_use(self) -> FirstUse | None:
        """The first call of ``torch.cuda`` that could have initialised CUDA, as recorded from
        nb_accel's import on."""
        call = first_cuda_call()
        return None if call is None else FirstUse(call.function, tuple(call.stack))

    def advice(self, ranks: int, precision: str, environ: Mapping[str, str]) -> DeviceAdvice:
        """What NVML's report of the GPUs calls for: bf16 emulated on older GPUs, NCCL's
        transports that hang with some drivers."""
        found = advise(nvml.gpu_report(), ranks, precision, environ)
        return DeviceAdvice(found.notes, found.worker_env)

    def rank_device(self, local_rank: int) -> torch.device:
        """``cuda:<local rank>``."""
        return torch.device("cuda", local_rank)

    def use_rank_device(self, local_rank: int, local_world_size: int) -> None:
        """Make the rank's GPU the current one."""
        del local_world_size
        torch.cuda.set_device(local_rank)

    def bound_device(self, local_rank: int) -> torch.device | None:
        """The rank's GPU: NCCL then builds its communicator while the group is made, when
        every rank arrives together, rather than at the first collective, where a rank that is
        late (rank 0 downloading a model in ``main_process_first()``) could outlast the wait."""
        return self.rank_device(local_rank)

    def model_device_ids(self, device: torch.device) -> list[int] | None:
        """The model's GPU."""
        return [device.index if device.index is not None else torch.cuda.current_device()]

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()``, unless CUDA is not initialised (then nothing is
        cached, and asking would initialise it)."""
        if cuda_facts.cuda_initialized():
            torch.cuda.empty_cache()
