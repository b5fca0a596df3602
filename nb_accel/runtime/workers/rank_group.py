"""A worker's process group, apart from how it finds its peers: the device it is bound to and
the rank's device (as the device type says), the group a forked worker inherited from the
kernel, and leaving the group at the end."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..device_types import device_type as named_device_type

__all__ = [
    "bound_device",
    "use_rank_device",
    "forget_inherited_process_group",
    "leave_process_group",
]

#: Process-group objects this worker never destroys: those inherited from the kernel by fork
#: (their destructors would join threads that do not exist in the child), and its own group
#: once unregistered at exit (its destructor waits ~20 ms for backend threads; the process exit
#: that follows at once releases every socket anyway).
_kept_alive: list[object] = []


def bound_device(device_type: str, local_rank: int) -> torch.device | None:
    """The device a rank's process group is bound to (``init_process_group(device_id=...)``),
    as its device type says (a GPU: NCCL then connects when the group is made)."""
    return named_device_type(device_type).bound_device(local_rank)


def use_rank_device(device_type: str, local_rank: int, local_world_size: int) -> None:
    """Make the rank's device the current one, as its device type says (on the CPU: share the
    cores among the machine's ranks)."""
    named_device_type(device_type).use_rank_device(local_rank, local_world_size)


def forget_inherited_process_group() -> None:
    """Drop a process group a forked worker inherited from the kernel, without touching it."""
    if not dist.is_available() or not dist.is_initialized():
        return
    from torch.distributed import distributed_c10d as c10d

    _kept_alive.append(c10d._world)
    c10d._world = c10d._World()


def leave_process_group() -> None:
    """Unregister this worker's process group, if it has one, on its way out (the group
    object itself is kept: the process ends next)."""
    if dist.is_initialized():
        _kept_alive.append(dist.group.WORLD)
        dist.destroy_process_group()
