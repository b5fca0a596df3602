"""A worker's process group, apart from how it finds its peers: the device it is bound to and
the rank's device (as the device type says), the group a forked worker inherited from the
kernel, and leaving the group at the end."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ..device_types import device_type as named_device_type

__all__ = [
    "bound_device",
    "use_rank_device",
    "forget_inherited_process_group",
    "leave_process_group",
    "torch_private",
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

    fresh = torch_private(
        c10d,
        "torch.distributed.distributed_c10d._World",
        "through which a forked worker drops the process group it inherited from the kernel: "
        "call torch.distributed.destroy_process_group() in the kernel before the launch, or "
        "launch with start_method='spawn'",
    )
    _kept_alive.append(c10d._world)
    c10d._world = fresh()


def leave_process_group() -> None:
    """Unregister this worker's process group, if it has one, on its way out (the group
    object itself is kept: the process ends next)."""
    if dist.is_initialized():
        _kept_alive.append(dist.group.WORLD)
        dist.destroy_process_group()


def torch_private(owner: object, path: str, needed_for: str) -> Any:
    """``owner``'s attribute named by the last part of ``path``: a private name of torch's that
    nb_accel relies on (``path`` names it in full, such as
    ``torch.distributed.distributed_c10d._World``). Where this torch lacks it, a
    ``RuntimeError`` names it, gives this torch's version and says ``needed_for``: what nb_accel
    does with it, and what to do instead."""
    found = getattr(owner, path.rpartition(".")[2], None)
    if found is None:
        raise RuntimeError(f"torch {torch.__version__} has no {path}, {needed_for}")
    return found
