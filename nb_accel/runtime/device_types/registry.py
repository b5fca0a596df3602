"""The device types by name, and which one a launch, or a rank, runs on.

A launch takes the CPU when asked (``cpu=True``; ``NB_ACCEL_USE_CPU=1`` when ``cpu`` is not
given), else the type its
environment asks for (a TPU runtime asks for XLA), else the first registered type with a
visible device, else the CPU. A rank takes the type its launch named in
:data:`DEVICE_TYPE_VARIABLE`; outside nb_accel's launches (under ``torchrun``) the one its
process group's backend runs on. A new device type is a :class:`~.interface.DeviceType`
subclass, declared as an ``nb_accel.device_types`` entry point by the package that holds it
(as ``pyproject.toml`` declares XLA's), or given to :func:`register_device_type`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..._registry import Registry
from ..plugins import DEVICE_TYPES
from .cpu import CPU_VARIABLE, CpuDevices
from .cuda import CudaDevices
from .group_backends import backends_by_device
from .interface import DeviceType

__all__ = [
    "DEVICE_TYPE_REGISTRY",
    "DEVICE_TYPE_VARIABLE",
    "choose_device_type",
    "device_type",
    "device_types",
    "process_device_type",
    "rank_device_type",
    "register_device_type",
    "unregister_device_type",
]

#: The variable a launch sets in its ranks: the name of the device type they run on.
DEVICE_TYPE_VARIABLE = "NB_ACCEL_DEVICE_TYPE"


def _made(name: str, found: object) -> DeviceType:
    """The device type a declared or built-in class stands for, made without arguments."""
    if not (isinstance(found, type) and issubclass(found, DeviceType)):
        raise TypeError(f"device type {name!r}: {found!r} is not a DeviceType subclass")
    return found()


#: Every device type by name, in the order a launch considers them: registered (newest first),
#: declared by an installed package (the ``nb_accel.device_types`` entry points: XLA's among
#: them, ``pyproject.toml``), then those of this folder; declared and built-in ones are made on
#: first use.
DEVICE_TYPE_REGISTRY: Registry[DeviceType] = Registry(
    "device type",
    built_in={"cuda": CudaDevices, "cpu": CpuDevices},
    group=DEVICE_TYPES,
    load=_made,
    in_workers=True,
)


def register_device_type(device: DeviceType) -> None:
    """Make ``device`` a device type launches can run on, under ``device.name``; it is
    considered before the types registered earlier, the declared and the built-in ones."""
    DEVICE_TYPE_REGISTRY.register(device.name, device)


def unregister_device_type(name: str) -> None:
    """Forget the device type registered as ``name`` (a declared or built-in one stays)."""
    DEVICE_TYPE_REGISTRY.unregister(name)


def device_types() -> list[DeviceType]:
    """Every device type, in the order a launch considers them: registered, declared by an
    installed package (the ``nb_accel.device_types`` entry points), built in."""
    return list(DEVICE_TYPE_REGISTRY.values())


def device_type(name: str) -> DeviceType:
    """The device type registered, declared or built in as ``name``; a ``ValueError`` naming
    the others if none is."""
    return DEVICE_TYPE_REGISTRY[name]


def choose_device_type(
    cpu: bool, environ: Mapping[str, str] | None = None, own_launchers: bool = True
) -> DeviceType:
    """The device type of a launch: the CPU with ``cpu``, else the one ``environ`` asks for,
    else the first with a visible device, else the CPU (``NB_ACCEL_USE_CPU`` is the launch's
    to read: it stands for ``cpu=True`` when ``cpu`` is not given). Without ``own_launchers``,
    only the types whose ranks join process groups (not XLA's, which need a launch of their
    own) are considered."""
    environ = os.environ if environ is None else environ
    if cpu:
        return device_type(CpuDevices.name)
    candidates = [c for c in device_types() if own_launchers or c.launcher is None]
    for candidate in candidates:
        if candidate.requested(environ):
            return candidate
    for candidate in candidates:
        if candidate.visible_count() > 0:
            return candidate
    return device_type(CpuDevices.name)


def process_device_type(cpu: bool) -> DeviceType:
    """The device type of a process outside nb_accel's launches (a script, ``torchrun``'s
    workers, the kernel itself): the first with a visible device whose ranks join process
    groups (``cpu``, or ``NB_ACCEL_USE_CPU=1``: the CPU)."""
    return choose_device_type(cpu or os.environ.get(CPU_VARIABLE) == "1", own_launchers=False)


def rank_device_type(backend: str | None, world_size: int, cpu: bool) -> DeviceType:
    """The device type of this process's rank: the one its launch named; else, in a group of
    several ranks, the one its backend runs collectives on (CPU tensors aside); else, on one
    process, :func:`process_device_type`."""
    named = os.environ.get(DEVICE_TYPE_VARIABLE)
    if named:
        return device_type(named)
    served = [name for name in backends_by_device(backend) if name != CpuDevices.name]
    if served:
        return device_type(served[0])
    if world_size > 1:
        return device_type(CpuDevices.name)
    return process_device_type(cpu)
