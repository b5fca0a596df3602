"""The device backend interface: one object per worker's state answers for its devices.

A :class:`DeviceBackend` is built once, with the :class:`~nb_accel.runtime.state.PartialState`
it serves (see :mod:`.choice`), and then reached as ``PartialState().device_backend``: the
collectives in :mod:`nb_accel.runtime.collectives.ops`, the barrier, device seeding, the
prepared loaders, the optimizer step and the checkpoint files ask it rather than asking which
devices they run on. The methods with a body here are what torch.distributed needs (nothing,
mostly); a backend overrides those its devices do differently.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

import torch

from ..tree import recursively_apply
from .shape_checks import check_same_shapes, debug_mode

__all__ = ["Rank", "DeviceRandomState", "DeviceBackend", "leaves"]

T = TypeVar("T")


class Rank(Protocol):
    """What a backend reads of the state it serves (live: the state's current values)."""

    backend: str | None
    num_processes: int
    process_index: int
    device: torch.device


class DeviceRandomState(Protocol):
    """A device's random generator state, taken when a checkpoint is saved."""

    def write(self, folder: Path, process_index: int) -> None:
        """Save it into the checkpoint ``folder``."""

    def resume(self) -> None:
        """Set the generator to it again (the last step of ``save_state``)."""


def leaves(tree: Any, operation: str) -> list[torch.Tensor]:
    """The tensors of ``tree`` in order (``operation`` names the caller in type errors)."""
    found: list[torch.Tensor] = []

    def collect(tensor: torch.Tensor) -> torch.Tensor:
        found.append(tensor)
        return tensor

    collect.__name__ = operation
    recursively_apply(collect, tree, error_on_other_type=True)
    return found


class DeviceBackend(ABC):
    """The devices of one worker's rank, as the rest of the runtime sees them.

    Args:
        rank: the state it serves; its fields come from :meth:`rank_fields`.
    """

    #: The name in messages (``"XLA"``).
    title: ClassVar[str]
    #: Whether a dispatcher may load batches on process 0 and send them to the others.
    dispatches_batches: ClassVar[bool] = True
    #: Whether the backend steps optimizers itself (:meth:`optimizer_step`).
    steps_optimizers: ClassVar[bool] = False

    def __init__(self, rank: Rank) -> None:
        self.rank = rank

    # --- the rank -------------------------------------------------------------------------

    @abstractmethod
    def rank_fields(self, cpu: bool, options: dict[str, Any]) -> dict[str, Any]:
        """The state's fields: ``backend``, ``num_processes``, ``process_index``,
        ``local_process_index``, ``num_local_processes``, ``device``, ``device_type`` (the
        :class:`~nb_accel.runtime.device_types.DeviceType` of ``device``), ``distributed_type``.

        Args:
            cpu: force the CPU even when GPUs are present.
            options: the options the state was given (process-group options among them).
        """

    @abstractmethod
    def barrier(self) -> None:
        """Block until every rank reaches this point (a no-op on one process)."""

    # --- collectives ----------------------------------------------------------------------

    @property
    @abstractmethod
    def collectives_active(self) -> bool:
        """True when collectives go through the backend; otherwise they are identities."""

    @abstractmethod
    def gather(self, tree: Any) -> Any:
        """Every rank's tensors of ``tree``, concatenated along the first dimension."""

    @abstractmethod
    def gather_object(self, obj: Any) -> Any:
        """Every rank's object; one flat list when every rank passes a list or tuple."""

    @abstractmethod
    def gather_object_among(self, obj: Any, members: list[int]) -> list[Any]:
        """The objects of the ranks in ``members`` (sorted, this rank among them and not
        alone), in rank order; only those ranks take part."""

    @abstractmethod
    def reduce(self, tree: Any, reduction: str, scale: float) -> Any:
        """Reduced copies of the tensors of ``tree`` on every rank, times ``scale``."""

    @abstractmethod
    def broadcast(self, tree: Any, from_process: int) -> Any:
        """Rank ``from_process``'s tensors written into ``tree``'s on every rank."""

    @abstractmethod
    def broadcast_object_list(self, object_list: list[Any], from_process: int) -> list[Any]:
        """The items of ``object_list`` replaced in place with rank ``from_process``'s."""

    @abstractmethod
    def largest_sizes(self, sizes: torch.Tensor) -> list[int]:
        """The element-wise maximum of every rank's ``sizes`` (1-D ``int64``, same length)."""

    def check_shapes(self, tree: Any, operation: str) -> None:
        """In debug mode, raise on every rank when the ranks' tensors differ in shape."""
        if debug_mode():
            rank = self.rank
            found = leaves(tree, operation)
            check_same_shapes(found, operation, rank.backend, rank.device, rank.num_processes)

    # --- random numbers, data -------------------------------------------------------------

    def seed_device(self, seed: int) -> None:
        """Seed the device's own generator (``torch.manual_seed`` seeds CUDA already)."""
        return None

    def shard_class(self, default: type[T]) -> type[T]:
        """The class of a prepared loader's shard: ``default`` or a subclass of it."""
        return default

    # --- training -------------------------------------------------------------------------

    def optimizer_step(
        self,
        optimizer: torch.optim.Optimizer,
        closure: Callable[[], float] | None,
        gradients_reduced: bool,
    ) -> Any:
        """Step ``optimizer`` (where :attr:`steps_optimizers`); ``gradients_reduced``: the
        gradients were averaged across ranks already this step."""
        raise NotImplementedError(f"{self.title} leaves the optimizer step to the optimizer")

    def reduce_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Average ``optimizer``'s gradients across ranks now (where the backend steps
        optimizers; elsewhere the model's wrapper averages them in the backward pass)."""
        return None

    def prepare_objects(self, objects: Sequence[Any]) -> Callable[[list[Any]], None] | None:
        """Called before ``prepare`` with its arguments; what it returns, when not ``None``, is
        called with the prepared objects."""
        return None

    # --- checkpoints ----------------------------------------------------------------------

    def on_cpu(self, tree: Any) -> Any:
        """``tree`` as it can be written to a file (device tensors the CPU cannot save,
        copied to it)."""
        return tree

    def contents_to_save(self, contents: T) -> T:
        """A checkpoint's contents as ``save_state`` writes them."""
        return contents

    def random_state(self) -> DeviceRandomState | None:
        """The device generator's state to save with a checkpoint, when it has one of its own."""
        return None

    def restore_random_state(
        self, folder: Path, process_index: int, load_kwargs: dict[str, Any] | None
    ) -> None:
        """The last step of ``load_state``: the device generator's state from ``folder``."""
        return None
