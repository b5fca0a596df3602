"""``XlaDataLoaderShard``: a prepared loader for XLA, in the manner of ``MpDeviceLoader``.

It is a :class:`~nb_accel.runtime.data.loader_shard.DataLoaderShard` (same sharding, resuming,
``end_of_dataloader``, ``skip_first_batches``) that puts each batch on the XLA device and marks
an XLA step before handing it out, as ``torch_xla``'s ``MpDeviceLoader`` does, so that a loop
without an optimizer step (evaluation) still runs its graph one batch at a time. Because XLA
runs a step's graph asynchronously, loading and moving the next batch overlaps the device's
work. Random generators are synchronised with rank 0 through ``xm`` at every new iteration.
Imported only on the XLA path.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch_xla.core.xla_model as xm

from ..data.loader_resume import Replay
from ..data.loader_shard import DataLoaderShard
from .device import mark_step, world_size
from .ops import broadcast_object_list

__all__ = ["XlaDataLoaderShard", "synchronize_rng_states"]


def _from_rank0(value: Any) -> Any:
    return broadcast_object_list([value], from_process=0)[0]


def synchronize_rng_states(rng_types: Iterable[str], generator: torch.Generator | None) -> None:
    """Give every rank rank 0's state of each generator in ``rng_types`` (``"torch"``,
    ``"xla"``, ``"generator"``: ``generator``; ``"cuda"`` does not apply and is skipped)."""
    for kind in rng_types:
        if kind == "torch":
            torch.set_rng_state(_from_rank0(torch.get_rng_state()))
        elif kind == "xla":
            xm.set_rng_state(int(_from_rank0(xm.get_rng_state())))
        elif kind == "generator" and generator is not None:
            generator.set_state(_from_rank0(generator.get_state()))


class XlaDataLoaderShard(DataLoaderShard):
    """A :class:`DataLoaderShard` whose batches land on the XLA device, one step each.

    Takes the arguments of :class:`DataLoaderShard`.
    """

    def begin(self) -> None:
        """Start an iteration: agree on the random generators with rank 0, then register."""
        if self.rng_types and world_size() > 1:
            synchronize_rng_states(self.rng_types, self.synchronized_generator)
        super().begin()

    def _batches(self, replay: Replay | None) -> Iterator[Any]:
        for batch in super()._batches(replay):
            mark_step()
            yield batch
