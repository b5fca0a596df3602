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
(:mod:`~nb_accel.runtime.debugging.deadline`) frees its own wait past it
(:func:`free_for_deadline`: NCCL's communicator aborted, gloo's connections shut down); the
command then fails with the timeout (:func:`take_deadline`) and the group is made anew at the
next :class:`Settle`.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from ..._messages import Release, Settle
from ...errors import is_peer_loss
from ..debugging.deadline import FAR_TIMEOUT, forget_in_flight, watching
from ..debugging.group_sockets import (
    connected_tcp_sockets,
    forget_group_sockets,
    note_group_sockets,
    shut_down_group_sockets,
)
from ..device_types import rank_device_type
from ..device_types.group_backends import cpu_collectives_only, uses_nccl
from .rank_group import bound_device, torch_private

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


@dataclass(frozen=True)
class GroupOrigin:
    """What a new process group is made from: the old one's store, backend, rank and size."""

    store: dist.Store
    backend: str
    rank: int
    world_size: int


#: The group this rank released, until the next :class:`Settle` replaces it.
_released: list[GroupOrigin] = []

#: Set when the kernel aborted this rank's collectives because a peer failed.
_aborted_for_peer = threading.Event()

#: The rank's own deadline passed in a collective: its message, the collective, and the stack
#: of the thread that waited (set by the deadline's thread, taken by the main thread).
_expired: list[tuple[str, str, str]] = []


#: What a missing private name of torch's stops, and what to do instead.
_NEEDED_FOR = (
    "with which a pool's ranks rebuild their process group after a failed cell: "
    "%distributed restart starts the pool anew"
)


#: The store the groups this process made anew hang from (each under a prefix of its own), so
#: that a group made from a remade group does not nest prefixes ever deeper.
_root: list[dist.Store] = []


def keep_root_store(store: dist.Store) -> None:
    """Make groups anew from ``store`` (the one this rank's first group was made from), so
    that a rank started later, which has only that store, finds the others' keys."""
    _root[:] = [store]


def current_group() -> GroupOrigin:
    """What this rank's default process group was made from (to make it anew later)."""
    if _root:
        store = _root[0]
    else:
        store = torch_private(
            c10d, "torch.distributed.distributed_c10d._get_default_store", _NEEDED_FOR
        )()
    return GroupOrigin(store, dist.get_backend(), dist.get_rank(), dist.get_world_size())


def _abort() -> None:
    forget_group_sockets()
    abort = getattr(c10d, "_abort_process_group", None)
    if abort is not None:
        abort()  # drops the queued collectives at once, closes the connections
    else:
        dist.destroy_process_group()


def _release() -> None:
    """Abort this rank's process group, keeping what the next :class:`Settle` makes it anew
    from."""
    _released[:] = [current_group()]
    _abort()


def abort_process_group() -> None:
    """Abort this rank's process group, if it has one: the ranks waiting for it in a
    collective fail at once, as if it had exited."""
    if dist.is_initialized():
        _abort()


def release_process_group(release: Release) -> None:
    """Abort this rank's process group: a collective another rank waits in with this one fails
    at once. The next :func:`settle_process_group` makes a new group."""
    if dist.is_initialized():
        _release()


def abort_for_failed_peer() -> None:
    """Abort this rank's NCCL process group while its main thread waits in a collective that a
    failed rank will never join (called from another thread: NCCL's abort is made for that).
    A gloo rank is freed by the failed rank's own abort, so nothing is done there."""
    if not dist.is_initialized() or not uses_nccl(dist.get_backend()):
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


def free_for_deadline(message: str, collective: str, stack: str) -> None:
    """Past the rank's own collective deadline (called on the deadline's thread): note the
    timeout for :func:`take_deadline` and free the main thread's wait (NCCL: abort the
    communicator; gloo: shut the group's connections down, see
    :mod:`~nb_accel.runtime.debugging.group_sockets`)."""
    _expired[:] = [(message, collective, stack)]
    if not dist.is_initialized():
        return
    if uses_nccl(dist.get_backend()):
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


def take_deadline() -> tuple[str, str, str] | None:
    """After a command: the timeout the rank's own deadline found meanwhile (its message, the
    collective and where the rank waited), or ``None``. A group whose wait was freed is
    released; the next :class:`Settle` makes a new one."""
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
            c10d, "torch.distributed.distributed_c10d._get_default_group", _NEEDED_FOR
        )()
        issued = torch_private(
            default, "torch.distributed.ProcessGroup._get_sequence_number_for_group", _NEEDED_FOR
        )()
    group.store.set(f"{prefix}/{group.rank}", str(issued))
    return tuple(int(group.store.get(f"{prefix}/{rank}")) for rank in range(group.world_size))


#: The command a pool's rank runs (its number), or ``launch``: what the store keys of the
#: agreements made in it hang from (:func:`~nb_accel.runtime.memory.find_executable_batch_size`).
_command: list[str] = ["launch"]


def begin_command(cell: int) -> None:
    """A pool's rank starts command ``cell`` (the same number on every rank)."""
    _command[0] = f"command/{cell}"


def command_scope() -> str:
    """What the ranks' agreements in the current command are numbered within."""
    return _command[0]


def let_go_of_process_group() -> None:
    """Abort this rank's process group, its gloo connections shut down first (whatever still
    holds the group): the ranks waiting for this one in a collective are freed."""
    shut_down_group_sockets()
    abort_process_group()


def remake_process_group(group: GroupOrigin, prefix: str, timeout_s: float) -> None:
    """Make the default process group anew from ``group``'s store (under ``prefix``, the same
    on every rank; the old group dropped first), with collectives bound by ``timeout_s`` (or by
    the rank's own deadline, where it keeps one)."""
    abort_process_group()
    _root[:] = [group.store]
    own_deadline = watching()  # the rank keeps the timeout itself: torch's is far away
    before = connected_tcp_sockets() if own_deadline else frozenset()
    dist.init_process_group(
        group.backend,
        store=dist.PrefixStore(prefix, group.store),
        rank=group.rank,
        world_size=group.world_size,
        timeout=FAR_TIMEOUT if own_deadline else timedelta(seconds=timeout_s),
        device_id=bound_device(
            rank_device_type(group.backend, group.world_size, cpu=False).name,
            int(os.environ.get("LOCAL_RANK", "0")),
        ),
    )
    if own_deadline and cpu_collectives_only(group.backend):
        dist.barrier()  # every connection made, to note them
        note_group_sockets(before)
    forget_in_flight()  # the dropped group's collectives (an aborted one may never retire)


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
    if dist.is_initialized():
        _abort()
    _released.clear()
    remake_process_group(group, f"{prefix}/group", settle.timeout_s)
    return issued
