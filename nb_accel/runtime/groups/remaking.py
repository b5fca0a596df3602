"""Making the default process group anew on every rank, from the store the old one hung from.

``find_executable_batch_size`` drops the group after a rank ran out of memory and makes it anew
for the next attempt; a pool's ranks do the same after a failed cell
(:mod:`~nb_accel.worker.process.regroup`). Both go through here: what a group is made from
(:class:`GroupOrigin`), dropping it (its gloo connections shut down first where asked), and
making it anew with the rank's own deadline where the rank keeps one
(:func:`~nb_accel.runtime.process_group.own_deadline`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from ..device_types import device_type as named_device_type
from ..device_types import rank_device_type
from ..device_types.group_backends import cpu_collectives_only
from ..process_group import FAR_TIMEOUT, own_deadline
from .sockets import (
    connected_tcp_sockets,
    forget_group_sockets,
    note_group_sockets,
    shut_down_group_sockets,
)

__all__ = [
    "GroupOrigin",
    "abort_process_group",
    "begin_command",
    "command_scope",
    "current_group",
    "keep_root_store",
    "let_go_of_process_group",
    "remake_process_group",
    "torch_private",
]

#: What a missing private name of torch's stops, and what to do instead.
NEEDED_FOR = (
    "with which a pool's ranks rebuild their process group after a failed cell: "
    "%distributed restart starts the pool anew"
)


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


@dataclass(frozen=True)
class GroupOrigin:
    """What a new process group is made from: the old one's store, backend, rank and size."""

    store: dist.Store
    backend: str
    rank: int
    world_size: int


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
            c10d, "torch.distributed.distributed_c10d._get_default_store", NEEDED_FOR
        )()
    return GroupOrigin(store, dist.get_backend(), dist.get_rank(), dist.get_world_size())


def abort_process_group() -> None:
    """Abort this rank's process group, if it has one: the ranks waiting for it in a
    collective fail at once, as if it had exited."""
    if not dist.is_initialized():
        return
    forget_group_sockets()
    abort = getattr(c10d, "_abort_process_group", None)
    if abort is not None:
        abort()  # drops the queued collectives at once, closes the connections
    else:
        dist.destroy_process_group()


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
    keeper = own_deadline()  # the rank keeps the timeout itself: torch's is far away
    before = connected_tcp_sockets() if keeper is not None else frozenset()
    device_type = rank_device_type(group.backend, group.world_size, cpu=False).name
    dist.init_process_group(
        group.backend,
        store=dist.PrefixStore(prefix, group.store),
        rank=group.rank,
        world_size=group.world_size,
        timeout=FAR_TIMEOUT if keeper is not None else timedelta(seconds=timeout_s),
        device_id=named_device_type(device_type).bound_device(
            int(os.environ.get("LOCAL_RANK", "0"))
        ),
    )
    if keeper is not None:
        if cpu_collectives_only(group.backend):
            dist.barrier()  # every connection made, to note them
            note_group_sockets(before)
        keeper.forget_in_flight()  # the dropped group's (an aborted one may never retire)


#: The command a pool's rank runs (its number), or ``launch``: what the store keys of the
#: agreements made in it hang from (:func:`~nb_accel.runtime.memory.find_executable_batch_size`).
_command: list[str] = ["launch"]


def begin_command(cell: int) -> None:
    """A pool's rank starts command ``cell`` (the same number on every rank)."""
    _command[0] = f"command/{cell}"


def command_scope() -> str:
    """What the ranks' agreements in the current command are numbered within."""
    return _command[0]
