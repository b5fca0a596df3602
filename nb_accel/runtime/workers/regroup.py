"""Rebuilding a persistent pool's process group after a cell failed or was interrupted.

A collective that one rank issued and the others never joined stays queued in the process
group: in the next cell it pairs with the others' first collective, which then computes with
the wrong tensors (and the rest hang). After a failed or interrupted cell the kernel sends
:class:`Settle`; every rank tells the others, through the group's store (which no queued
collective can hold up), how many collectives it has issued on the group. When the counts
differ, the group is aborted (dropping what is queued) and made anew on every rank.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from .rank_group import nccl_device

__all__ = ["Settle", "settle_process_group"]


@dataclass(frozen=True)
class Settle:
    """Kernel to persistent worker, after a failed or interrupted command: rebuild the process
    group if a collective was left unmatched. ``cell`` names this step (the same on every rank);
    ``timeout_s`` bounds the new group's collectives."""

    cell: int
    timeout_s: float


def _issued_per_rank(store: dist.Store, prefix: str) -> tuple[int, ...]:
    group = c10d._get_default_group()
    issued = group._get_sequence_number_for_group()  # type: ignore[attr-defined]
    store.set(f"{prefix}/{dist.get_rank()}", str(issued))
    return tuple(int(store.get(f"{prefix}/{rank}")) for rank in range(dist.get_world_size()))


def settle_process_group(settle: Settle) -> tuple[int, ...] | None:
    """Compare the collectives every rank has issued; when they differ, abort the process group
    and make a new one, and return the counts (rank by rank). ``None``: nothing to do."""
    if not dist.is_initialized():
        return None
    store = c10d._get_default_store()
    prefix = f"nb_accel/settle/{settle.cell}"
    issued = _issued_per_rank(store, prefix)
    if len(set(issued)) == 1:
        return None
    backend, rank, world_size = dist.get_backend(), dist.get_rank(), dist.get_world_size()
    abort = getattr(c10d, "_abort_process_group", None)
    if abort is not None:
        abort()  # drops the queued collectives at once
    else:
        dist.destroy_process_group()
    dist.init_process_group(
        backend,
        store=dist.PrefixStore(f"{prefix}/group", store),
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=settle.timeout_s),
        device_id=nccl_device(backend, int(os.environ.get("LOCAL_RANK", "0"))),
    )
    return issued
