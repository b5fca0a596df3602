"""CUDA GPUs (NVIDIA's, and AMD's through ROCm, which torch names ``cuda`` too): one rank per
GPU, collectives through NCCL, devices counted by NVML so that the kernel can still fork."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch

from ..cuda_origin import first_cuda_call
from ..enums import DistributedType
from . import cuda_facts, nvml
from .gpu_advice import advise
from .group_backends import uses_nccl, with_cpu_backend
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
    context_parallel: ClassVar[bool] = True
    cluster_resource: ClassVar[str] = "GPU"

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

    def rng_state(self) -> torch.Tensor | None:
        """The current GPU's generator state (``None`` where CUDA is not available)."""
        return torch.cuda.get_rng_state() if torch.cuda.is_available() else None

    def set_rng_state(self, state: torch.Tensor) -> None:
        """Give the current GPU's generator ``state``."""
        torch.cuda.set_rng_state(state)

    def saved_rng_states(self) -> list[torch.Tensor] | None:
        """Every GPU's generator state, once this process has initialised CUDA (before, they
        are still to be seeded, and asking would initialise it)."""
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return list(torch.cuda.get_rng_state_all())
        return None

    def restore_rng_states(self, states: list[torch.Tensor]) -> None:
        """Every GPU's generator state, where CUDA is available; a ``ValueError`` when the
        states are for another number of GPUs."""
        if not torch.cuda.is_available():
            return
        if len(states) != torch.cuda.device_count():
            raise ValueError(
                f"the saved random states cover {len(states)} CUDA devices; this process sees "
                f"{torch.cuda.device_count()}"
            )
        torch.cuda.set_rng_state_all(states)

    def collective_device(self, backend: str | None, device: torch.device) -> torch.device:
        """``device`` under NCCL (it reduces CUDA tensors only), else the CPU."""
        return device if uses_nccl(backend) else torch.device("cpu")

    def detached_collectives(self, backend: str | None) -> bool:
        """True under NCCL: its collectives run on the GPU's streams, and its flight recorder
        says which finished."""
        return uses_nccl(backend)

    def copy_to_host(self, tensor: torch.Tensor) -> tuple[torch.Tensor, Callable[[], None] | None]:
        """Copy ``tensor`` into pinned host memory on a stream of its own, made to wait for the
        caller's current stream and the GPU's default stream (``tensor`` may have been computed
        on either); ``tensor``'s memory is marked in use by that stream, so that freeing it
        cannot hand it to new work before the copy ran. What is returned to call waits for an
        event recorded after the copy: neither the caller nor the reader queues behind the
        GPU's other work."""
        copier = _copy_stream(tensor.device)
        current = torch.cuda.current_stream(tensor.device)
        copier.wait_stream(current)
        default = torch.cuda.default_stream(tensor.device)
        if current != default:
            copier.wait_stream(default)
        copy = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        with torch.cuda.stream(copier):
            copy.copy_(tensor, non_blocking=True)
        tensor.record_stream(copier)
        return copy, copier.record_event().synchronize


#: The stream each GPU's tensors are copied to the host on (made on first use).
_copy_streams: dict[torch.device, Any] = {}


def _copy_stream(device: torch.device) -> Any:
    stream = _copy_streams.get(device)
    if stream is None:
        stream = _copy_streams[device] = torch.cuda.Stream(device)
    return stream
