"""Device types: what kind of device a launch's ranks run on (the CPU, CUDA GPUs, XLA devices),
behind one interface that the kernel's launch plan and the workers both ask (``interface.py``),
the types themselves (``cpu.py``, ``cuda.py``, with what CUDA looks like from a process that
must not initialise it: ``cuda_facts.py``, ``cuda_fork.py``, ``nvml.py``, ``gpu_advice.py``),
the process groups' backend strings (``group_backends.py``) and the registry (``registry.py``)."""

from .interface import DeviceAdvice, DeviceType, FirstUse
from .registry import (
    DEVICE_TYPE_VARIABLE,
    choose_device_type,
    device_type,
    device_types,
    process_device_type,
    rank_device_type,
    register_device_type,
    unregister_device_type,
)

__all__ = [
    "DEVICE_TYPE_VARIABLE",
    "DeviceAdvice",
    "DeviceType",
    "FirstUse",
    "choose_device_type",
    "device_type",
    "device_types",
    "process_device_type",
    "rank_device_type",
    "register_device_type",
    "unregister_device_type",
]
