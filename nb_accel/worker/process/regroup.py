"""Rebuilding a persistent pool's process group after a cell failed or was interrupted.

A collective that one rank issued and the others never joined stays queued in the process
group: in the next cell it pairs with the others' first collective, which then computes with
the wrong tensors (and the rest hang). After a failed or interrupted cell the kernel sends
:class:`Settle`; every rank tells the others, through the group's store (which no queued
collective can hold up), how many collectives it has issued on the group. When the counts
differ, the group is aborted (dropping what is queued) and made anew on every rank.

A rank whose cell failed while others still run theirs is sent :class:`Release`: it aborts its
group at once, so that a collective the others wait in with it fails now (its connections
close) instead of at the timeout. The next :class:`Settle` then makes a new group everywhere.
An NCCL rank's collective runs apart from its connections to the failed rank: the kernel has
the waiting rank abort its own communicator too (:func:`abort_for_failed_peer`, run by another
thread, since the main thread is the one waiting).

A rank that keeps its collective deadline itself
(:mod:`~nb_accel.worker.debugging.deadline`) frees its own wait past it
(:func:`free_for_deadline`: NCCL's communicator aborted, gloo's connections shut down); the
command then fails with the timeout (:func:`take_deadline`) and the group is made anew at the
next :class:`Settle`.
"""

from __future__ import annotations

import threading

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from ..._messages import Release, Settle
from ...errors import is_peer_loss
from ...runtime.device_types import rank_device_type
from ...runtime.groups.remaking import (
    NEEDED_FOR,
    GroupOrigin,
    abort_process_group,
    begin_command,
    command_scope,
    current_group,
    keep_root_store,
    let_go_of_process_group,
    remake_process_group,
    torch_private,
)
from ...runtime.groups.sockets import shut_down_group_sockets

__all__ = [
    "GroupOrigin",
    "PeerFailed",
    "abort_for_failed_peer",
    "begin_command",
    "command_scope",
    "current_group",
    "forget_abort_for_peer",
    "free_for_deadline",
    "join_process_group",
    "keep_root_store",
    "let_go_of_process_group",
    "release_broken_group",
    "release_process_group",
    "remake_process_group",
    "settle_process_group",
    "take_abort_for_peer",
    "take_deadline",
]


class PeerFailed(RuntimeError):
    """A collective this rank waited in was aborted: another rank's command had failed."""


#: The group this rank released, until the next :class:`Settle` replaces it.
_released: list[GroupOrigin] = []

#: Set when the kernel aborted this rank's collectives because a peer failed.
_aborted_for_peer = threading.Event()

#: The rank's own deadline passed in a collective: its message, the collective, the stack of
#: the thread that waited, and whether a prompt of the kernel was open then (set by the
#: deadline's thread, taken by the main thread).
_expired: list[tuple[str, str, str, bool]] = []


def _release() -> None:
    """Abort this rank's process group, keeping what the next :class:`Settle` makes it anew
    from. Its gloo connections are shut down first: the group may still be held (a model
    prepared with DDP holds it), and a held group's connections outlive its abort, leaving
    the ranks that wait for this one in a collective waiting until their timeout."""
    _released[:] = [current_group()]
    let_go_of_process_group()


def release_process_group(release: Release) -> None:
    """Abort this rank's process group: a collective another rank waits in with this one fails
    at once. The next :func:`settle_process_group` makes a new group."""
    if dist.is_initialized():
        _release()


def _collectives_detached() -> bool:
    """Whether this rank's group runs its collectives apart from the call that waits (NCCL's:
    see :meth:`~nb_accel.runtime.device_types.DeviceType.detached_collectives`)."""
    backend = dist.get_backend()
    devices = rank_device_type(backend, dist.get_world_size(), cpu=False)
    return devices.detached_collectives(backend)


def abort_for_failed_peer() -> None:
    """Abort this rank's NCCL process group while its main thread waits in a collective that a
    failed rank will never join (called from another thread: NCCL's abort is made for that).
    A gloo rank is freed by the failed rank's own abort, so nothing is done there."""
    if not dist.is_initialized() or not _collectives_detached():
        return
    _aborted_for_peer.set()
    _release()


def forget_abort_for_peer() -> None:
    """Clear the mark of an abort that came between two commands (the next :class:`Settle`
    rebuilds the group; the next command's failure is its own)."""
    _aborted_for_peer.clear()


def take_abort_for_peer(error: BaseException) -> BaseException:
    """``error``, the one a command raised, or :class:`PeerFailed` when the kernel aborted this
    rank's collectives meanwhile (the backend's words then are a consequence); the mark is
    cleared."""
    if not _aborted_for_peer.is_set():
        return error
    _aborted_for_peer.clear()
    aborted = PeerFailed(
        "the collective this rank waited in was aborted because another rank failed"
    )
    aborted.__cause__ = error
    return aborted


def free_for_deadline(message: str, collective: str, stack: str, at_prompt: bool) -> None:
    """Past the rank's own collective deadline (called on the deadline's thread): note the
    timeout for :func:`take_deadline` and free the main thread's wait (NCCL: abort the
    communicator; gloo: shut the group's connections down, see
    :mod:`~nb_accel.runtime.groups.sockets`)."""
    _expired[:] = [(message, collective, stack, at_prompt)]
    if not dist.is_initialized():
        return
    if _collectives_detached():
        _release()
    else:
        shut_down_group_sockets()


def release_broken_group(error: BaseException) -> None:
    """After a command failed with ``error``: when it says a peer's connection closed, this
    rank's group is broken; abort it now (the ranks still waiting for this one in it are freed
    too: a rank that gave up at its deadline closed its connections, the others follow). The
    next :class:`Settle` makes a new one."""
    if dist.is_initialized() and is_peer_loss(str(error)):
        _release()


def take_deadline() -> tuple[str, str, str, bool] | None:
    """After a command: the timeout the rank's own deadline found meanwhile (its message, the
    collective, where the rank waited, and whether a prompt was open then), or ``None``. A
    group whose wait was freed is released; the next :class:`Settle` makes a new one."""
    if not _expired:
        return None
    found = _expired.pop()
    if dist.is_initialized():
        _release()
    return found


def _issued_per_rank(group: GroupOrigin, prefix: str) -> tuple[int, ...]:
    issued = -1  # released: its group is gone, a new one is needed
    if dist.is_initialized():
        default = torch_private(
            c10d, "torch.distributed.distributed_c10d._get_default_group", NEEDED_FOR
        )()
        issued = torch_private(
            default, "torch.distributed.ProcessGroup._get_sequence_number_for_group", NEEDED_FOR
        )()
    group.store.set(f"{prefix}/{group.rank}", str(issued))
    return tuple(int(group.store.get(f"{prefix}/{rank}")) for rank in range(group.world_size))


def join_process_group(origin: GroupOrigin, settle: Settle) -> None:
    """A rank started in place of one that died: join the process group the other ranks make
    anew at ``settle`` (from ``origin``'s store). This rank has no group, so they do."""
    _released[:] = [origin]
    settle_process_group(settle)


def settle_process_group(settle: Settle) -> tuple[int, ...] | None:
    """Compare the collectives every rank has issued; when they differ (or a rank released its
    group), abort the process group and make a new one, and return the counts (rank by rank;
    -1 for a released group). ``None``: nothing to do."""
    if dist.is_initialized():
        group = current_group()
    elif _released:
        group = _released[0]
    else:
        return None
    prefix = f"nb_accel/settle/{settle.cell}"
    issued = _issued_per_rank(group, prefix)
    if len(set(issued)) == 1 and issued[0] >= 0:
        return None
    abort_process_group()
    _released.clear()
    remake_process_group(group, f"{prefix}/group", settle.timeout_s)
    return issued
