"""Process-group backend strings (one backend such as ``"nccl"``, or one per device type such as
``"cuda:nccl,cpu:gloo"``), and the backend of the groups nb_accel makes.

A group on GPUs runs NCCL, which reduces CUDA tensors only. FSDP's CPU offload keeps the shards,
their gradients and the optimizer state in CPU memory, so the norm of the gradient, whole state
dicts and rank 0's weights broadcast into the shards are collectives on CPU tensors: such a
group is made device-mapped, ``"cuda:nccl,cpu:gloo"`` (NCCL for CUDA tensors, gloo for CPU
ones), as Accelerate does and as torch's own default for ``init_process_group()`` is.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..._flags import parse_flag

__all__ = [
    "BACKEND_DEVICE_TYPES",
    "backend_for",
    "backends_by_device",
    "new_group_backend",
    "offload_asked_by_environment",
    "cpu_collectives_only",
    "uses_gloo",
    "uses_nccl",
    "with_cpu_backend",
]

#: The device type each single-device backend runs its collectives on.
BACKEND_DEVICE_TYPES = {"nccl": "cuda", "gloo": "cpu", "mpi": "cpu", "xccl": "xpu", "hccl": "npu"}


def backends_by_device(backend: str | None) -> dict[str, str]:
    """The backend a group created as ``backend`` uses for each device type:
    ``{"cuda": "nccl"}`` for ``"nccl"``, ``{"cuda": "nccl", "cpu": "gloo"}`` for
    ``"cuda:nccl,cpu:gloo"``; an unknown name (or none) gives ``{}``."""
    found: dict[str, str] = {}
    for part in (backend or "").lower().split(","):
        device_type, _, name = part.strip().rpartition(":")
        device_type = device_type or BACKEND_DEVICE_TYPES.get(name, "")
        if device_type and name:
            found[device_type] = name
    return found


def backend_for(backend: str | None, device_type: str) -> str | None:
    """The backend a group created as ``backend`` runs collectives on ``device_type``
    tensors with (None: it cannot)."""
    return backends_by_device(backend).get(device_type)


def uses_nccl(backend: str | None) -> bool:
    """True for a group whose CUDA tensors go through NCCL (``"nccl"``, ``"cuda:nccl,..."``)."""
    return backend_for(backend, "cuda") == "nccl"


def uses_gloo(backend: str | None) -> bool:
    """True for a group whose collectives on some device type go through gloo."""
    return "gloo" in backends_by_device(backend).values()


def cpu_collectives_only(backend: str | None) -> bool:
    """True for a group that runs collectives on CPU tensors only (``"gloo"``): a barrier
    there is cheap, and is how its ranks confirm they are all connected."""
    return set(backends_by_device(backend)) == {"cpu"}


def with_cpu_backend(backend: str) -> str:
    """``backend`` with gloo for CPU tensors beside it: ``"nccl"`` gives
    ``"cuda:nccl,cpu:gloo"``; a backend that serves the CPU already is returned as it is."""
    by_device = backends_by_device(backend)
    if "cpu" in by_device or not by_device:
        return backend
    return ",".join(f"{device}:{name}" for device, name in {**by_device, "cpu": "gloo"}.items())


def offload_asked_by_environment(environ: Mapping[str, str] | None = None) -> bool:
    """True when ``FSDP_OFFLOAD_PARAMS`` (Accelerate's variable for the plugin's
    ``cpu_offload``) asks FSDP to keep the shards in CPU memory."""
    value = (environ if environ is not None else os.environ).get("FSDP_OFFLOAD_PARAMS", "")
    return bool(value.strip()) and parse_flag(value, "FSDP_OFFLOAD_PARAMS")


def new_group_backend(cuda: bool, cpu_offload: bool) -> str:
    """The backend of a process group nb_accel creates: NCCL on GPUs, gloo on the CPU; on GPUs
    with FSDP's CPU offload (``cpu_offload``) NCCL with gloo for CPU tensors beside it."""
    if not cuda:
        return "gloo"
    return with_cpu_backend("nccl") if cpu_offload else "nccl"
