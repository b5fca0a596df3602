"""What NVML (``libnvidia-ml``, the library behind ``nvidia-smi``) says about the visible NVIDIA
GPUs: name and compute capability, and the driver's version. NVML never initialises CUDA, so
this is safe in the kernel before a fork. Without NVML there is no report, and whatever would
have used it is skipped.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["GpuInfo", "GpuReport", "gpu_report", "visible"]

_NAME_BYTES = 96


@dataclass(frozen=True)
class GpuInfo:
    """One GPU: its NVML name (``"Tesla T4"``, ``"NVIDIA GeForce RTX 4090"``), its UUID
    (``"GPU-..."``) and its compute capability (``(7, 5)``; ``None`` when NVML does not say)."""

    name: str
    uuid: str = ""
    capability: tuple[int, int] | None = None


@dataclass(frozen=True)
class GpuReport:
    """The GPUs ``CUDA_VISIBLE_DEVICES`` leaves visible, and the driver's version
    (``"550.54.15"``; ``None`` when NVML does not say)."""

    gpus: tuple[GpuInfo, ...]
    driver: str | None


def visible(gpus: list[GpuInfo], spec: str | None) -> list[GpuInfo] | None:
    """The GPUs that ``CUDA_VISIBLE_DEVICES=spec`` selects, in its order, read as CUDA reads
    it: indices or ``GPU-`` UUID prefixes, up to the first entry that names none.
    ``None`` for MIG instances, whose GPUs NVML's list does not name this way."""
    if spec is None:
        return list(gpus)
    chosen: list[GpuInfo] = []
    for entry in (part.strip() for part in spec.split(",")):
        if entry.startswith("MIG-"):
            return None
        if entry.isdigit() and int(entry) < len(gpus):
            chosen.append(gpus[int(entry)])
            continue
        matches = [gpu for gpu in gpus if entry.startswith("GPU-") and gpu.uuid.startswith(entry)]
        if len(matches) != 1:
            break
        chosen.append(matches[0])
    return chosen


def _text(function: Callable[..., int], *args: object) -> str | None:
    buffer = ctypes.create_string_buffer(_NAME_BYTES)
    if function(*args, buffer, ctypes.c_uint(_NAME_BYTES)) != 0:
        return None
    return buffer.value.decode(errors="replace")


def _device(nvml: ctypes.CDLL, index: int) -> GpuInfo | None:
    handle = ctypes.c_void_p()
    if nvml.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)) != 0:
        return None
    name = _text(nvml.nvmlDeviceGetName, handle) or "an NVIDIA GPU"
    uuid = _text(nvml.nvmlDeviceGetUUID, handle) or ""
    major, minor = ctypes.c_int(), ctypes.c_int()
    found = nvml.nvmlDeviceGetCudaComputeCapability(
        handle, ctypes.byref(major), ctypes.byref(minor)
    )
    capability = (major.value, minor.value) if found == 0 else None
    return GpuInfo(name, uuid, capability)


def gpu_report() -> GpuReport | None:
    """What NVML says about the visible GPUs, or ``None`` without NVML (or for MIG instances)."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2() != 0:
            return None
    except (OSError, AttributeError):
        return None
    try:
        count = ctypes.c_uint()
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return None
        gpus = [_device(nvml, index) for index in range(count.value)]
        if any(gpu is None for gpu in gpus):
            return None
        driver = _text(nvml.nvmlSystemGetDriverVersion)
        shown = visible([g for g in gpus if g is not None], os.environ.get("CUDA_VISIBLE_DEVICES"))
    except AttributeError:  # an NVML without one of these functions
        return None
    finally:
        nvml.nvmlShutdown()
    return None if shown is None else GpuReport(tuple(shown), driver)
