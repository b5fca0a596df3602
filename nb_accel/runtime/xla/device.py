"""The XLA runtime as the rest of the package sees it: the device, the ranks, step marking.

Imported only on the XLA path (inside a worker of an XLA launch, where ``torch_xla`` is
already loaded); importing this module imports ``torch_xla``. Newer ``torch_xla`` spellings
are preferred (``torch_xla.device()``, ``torch_xla.sync()``), older ones used when absent.
"""

from __future__ import annotations

from typing import Any

import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.runtime as xr

__all__ = [
    "xla_device",
    "mark_step",
    "seed_device",
    "world_size",
    "global_ordinal",
    "devices_in_process",
    "state_fields",
    "is_xla_tensor",
]


def xla_device() -> torch.device:
    """This process's XLA device (``xla:0`` in a one-device-per-process launch)."""
    maker = getattr(torch_xla, "device", None)
    return torch.device(maker() if maker is not None else xm.xla_device())


def mark_step() -> None:
    """Cut the lazily traced graph here and run it (``torch_xla.sync()``)."""
    sync = getattr(torch_xla, "sync", None)
    if sync is not None:
        sync()
    else:
        xm.mark_step()


def seed_device(seed: int) -> None:
    """Seed the XLA device's random number generator."""
    xm.set_rng_state(seed)


def world_size() -> int:
    """Number of XLA devices (ranks) taking part in the launch."""
    return int(xr.world_size())


def global_ordinal() -> int:
    """This rank's index among all XLA devices of the launch."""
    return int(xr.global_ordinal())


def devices_in_process() -> int:
    """XLA devices this process runs ranks on, one thread each.

    More than one where ``xmp.spawn`` runs several ranks per process: TPU v2/v3 (one per
    TensorCore of the process's chip) and the CPU device with ``CPU_NUM_DEVICES`` above 1. A
    one-rank launch (``nprocs=1``) uses the first device only, however many the process sees.
    """
    return 1 if world_size() == 1 else int(xr.addressable_device_count())


def state_fields() -> dict[str, Any]:
    """What ``PartialState`` holds in an XLA worker: ranks from the XLA runtime (per thread
    where a process runs several ranks), the device."""
    return {
        "backend": "xla",
        "num_processes": world_size(),
        "process_index": global_ordinal(),
        "local_process_index": int(xr.local_ordinal()),
        "num_local_processes": int(xr.local_process_count()) * devices_in_process(),
        "device": xla_device(),
    }


def is_xla_tensor(value: Any) -> bool:
    """True for a tensor on an XLA device."""
    return isinstance(value, torch.Tensor) and value.device.type == "xla"
