"""The XLA device backend: the runtime's questions about devices answered with ``torch_xla``.

An adapter over the rest of this package: ranks and device from :mod:`.device`, collectives
from :mod:`.ops`, the loader from :mod:`.loader`, the optimizer step and prepared parameters
from :mod:`.train`, checkpoint I/O from :mod:`.checkpoint`. Built for the workers of an XLA
launch (``NB_ACCEL_BACKEND=xla``; see :mod:`nb_accel.runtime.device_backends.choice`).
Imported only on the XLA path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import torch

from ..device_backends.base import DeviceBackend, DeviceRandomState
from ..device_types import device_type
from ..enums import DistributedType
from . import ops
from .checkpoint import XlaRandomState, contents_on_cpu, load_xla_random_state, on_cpu
from .device import seed_device, state_fields
from .device_type import XlaDevices
from .loader import XlaDataLoaderShard
from .train import (
    follow_moved_parameters,
    optimizer_step,
    parameters_by_model,
    reduce_gradients,
    share_rank0_parameters,
)

__all__ = ["XlaBackend"]

T = TypeVar("T")


class XlaBackend(DeviceBackend):
    """torch_xla: ranks from the XLA runtime, ``xm`` collectives (which run even on one
    device, where they cost next to nothing), batches and steps that mark XLA steps, and
    checkpoints written through the CPU.

    Args:
        rank: the state it serves.
    """

    title = "XLA"
    dispatches_batches = False
    steps_optimizers = True

    def rank_fields(self, cpu: bool, options: dict[str, Any]) -> dict[str, Any]:
        """Ranks (per thread where a process runs several) and device from torch_xla."""
        return {
            **state_fields(),
            "device_type": device_type(XlaDevices.name),
            "distributed_type": DistributedType.XLA,
        }

    def barrier(self) -> None:
        """An ``all_reduce`` every rank waits for."""
        ops.barrier()

    @property
    def collectives_active(self) -> bool:
        """Always: every rank takes part in each collective."""
        return True

    def gather(self, tree: Any) -> Any:
        """``xm.all_gather`` of each tensor."""
        return ops.gather(tree)

    def gather_object(self, obj: Any) -> Any:
        """Pickled objects exchanged as byte rows."""
        return ops.gather_object(obj)

    def gather_object_among(self, obj: Any, members: list[int]) -> list[Any]:
        """Every rank's object; some ranks only cannot exchange on XLA."""
        if len(members) < self.rank.num_processes:
            raise NotImplementedError(
                "on XLA every rank takes part in each collective: use even_batches=True "
                "(the default) for loaders whose results go through gather_for_metrics"
            )
        return ops.exchange_objects(obj, "nb_accel.gather_object_among")

    def reduce(self, tree: Any, reduction: str, scale: float) -> Any:
        """``xm.all_reduce`` of a copy of each tensor."""
        return ops.reduce(tree, reduction=reduction, scale=scale)

    def broadcast(self, tree: Any, from_process: int) -> Any:
        """``xm.collective_broadcast`` into each tensor."""
        return ops.broadcast(tree, from_process=from_process)

    def broadcast_object_list(self, object_list: list[Any], from_process: int) -> list[Any]:
        """Rank ``from_process``'s items, pickled and exchanged."""
        return ops.broadcast_object_list(object_list, from_process=from_process)

    def largest_sizes(self, sizes: torch.Tensor) -> list[int]:
        """Every rank's sizes exchanged as objects, then the maximum of each column."""
        return ops.largest_sizes(sizes.tolist())

    def seed_device(self, seed: int) -> None:
        """Seed the XLA device's generator."""
        seed_device(seed)

    def shard_class(self, default: type[T]) -> type[T]:
        """:class:`~.loader.XlaDataLoaderShard`: batches on the device, one XLA step each."""
        return cast("type[T]", XlaDataLoaderShard)

    def optimizer_step(
        self,
        optimizer: torch.optim.Optimizer,
        closure: Callable[[], float] | None,
        gradients_reduced: bool,
    ) -> Any:
        """``xm.optimizer_step`` (or a plain step once the gradients were reduced), then an
        XLA step."""
        return optimizer_step(optimizer, closure, gradients_reduced)

    def reduce_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """``xm.reduce_gradients``."""
        reduce_gradients(optimizer)

    def prepare_objects(self, objects: Sequence[Any]) -> Callable[[list[Any]], None] | None:
        """Moving a model to the XLA device gives it new parameters: the optimizers follow
        them, and every rank starts from rank 0's values."""
        moved = parameters_by_model(objects)

        def finish(prepared: list[Any]) -> None:
            follow_moved_parameters(moved, prepared)
            share_rank0_parameters(prepared)

        return finish

    def on_cpu(self, tree: Any) -> Any:
        """``tree`` with every XLA tensor copied to the CPU."""
        return on_cpu(tree)

    def contents_to_save(self, contents: T) -> T:
        """Each object's ``state_dict()`` through the CPU, as ``xm.save`` writes."""
        return cast(T, contents_on_cpu(cast(Any, contents)))

    def random_state(self) -> DeviceRandomState | None:
        """This rank's XLA generator, taken after the pending step ran."""
        return XlaRandomState()

    def restore_random_state(
        self, folder: Path, process_index: int, load_kwargs: dict[str, Any] | None
    ) -> None:
        """Run the pending XLA step, then set the XLA generator saved in ``folder``."""
        load_xla_random_state(folder, process_index, load_kwargs)
