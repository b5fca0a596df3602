"""A worker's process group, apart from how it finds its peers: the device it is bound to and
the rank's device (as the device type says), who keeps its collective deadline, the group a
forked worker inherited from the kernel, and leaving the group at the end."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from ...runtime.device_types import device_type as named_device_type
from ...runtime.groups.remaking import torch_private
from ...runtime.groups.sockets import connected_tcp_sockets, note_group_sockets
from ...runtime.process_group import FAR_TIMEOUT
from ..debugging.deadline import Expired, watch_collectives
from ..reporting.collective_trail import recorder_available

__all__ = [
    "OwnDeadline",
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


class OwnDeadline:
    """Whether a rank keeps its collective timeout itself (:mod:`~nb_accel.worker.debugging.
    deadline`), and the steps around making its process group that this takes. Create it just
    before the group is made.

    Args:
        timeout_s: the launch's collective timeout.
        clock_path: the kernel's prompt clock file ("": torch keeps the deadline).
        report: what the rank does past its deadline (``None``: no way to say it, torch keeps
            the deadline).
    """

    def __init__(self, timeout_s: float, clock_path: str, report: Expired | None) -> None:
        self.timeout_s = timeout_s
        self.clock_path = clock_path
        self.report = report
        #: Whether the rank keeps it (where torch has a flight recorder to read).
        self.kept = bool(clock_path) and report is not None and recorder_available()
        self._before = connected_tcp_sockets() if self.kept else frozenset()

    def group_timeout(self) -> timedelta:
        """The timeout torch's process group is made with."""
        return FAR_TIMEOUT if self.kept else timedelta(seconds=self.timeout_s)

    def start(self) -> None:
        """The group is made: start keeping the deadline."""
        if self.kept and self.report is not None:
            watch_collectives(self.timeout_s, self.clock_path, self.report)

    def connected(self) -> None:
        """Every connection of a gloo group is made (after its first barrier): note them, to
        free a wait past the deadline."""
        if self.kept:
            note_group_sockets(self._before)


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
