"""A worker's process group, apart from how it finds its peers: the device an NCCL group is
bound to, the rank's device and CPU threads, the group a forked worker inherited from the
kernel, and leaving the group at the end."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from .accelerate_env import export_thread_count

__all__ = [
    "nccl_device",
    "use_rank_device",
    "forget_inherited_process_group",
    "leave_process_group",
]

#: Process-group objects this worker never destroys: those inherited from the kernel by fork
#: (their destructors would join threads that do not exist in the child), and its own group
#: once unregistered at exit (its destructor waits ~20 ms for backend threads; the process exit
#: that follows at once releases every socket anyway).
_kept_alive: list[object] = []


def nccl_device(backend: str, local_rank: int) -> torch.device | None:
    """The GPU an NCCL process group is bound to (``None`` for other backends).

    Bound, the group builds its communicator while the process group is made, when every rank
    arrives together, rather than at the first collective, where a rank that is late (rank 0
    downloading a model in ``main_process_first()``) could outlast the wait for it.
    """
    return torch.device("cuda", local_rank) if "nccl" in backend else None


def use_rank_device(device_type: str, local_rank: int, local_world_size: int) -> None:
    """Make the rank's GPU the current one; on the CPU, share the cores among the machine's
    ranks (unless ``OMP_NUM_THREADS`` says how many) and tell the libraries that read it."""
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
    elif "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world_size))
        export_thread_count()


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
