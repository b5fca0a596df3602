"""The Accelerator's process-control and collective methods, delegating to state and ops."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

from .collectives import ops
from .parallelism.tensor import mesh_group_size
from .state import GradientState, PartialState

__all__ = ["ProcessMethods"]

F = TypeVar("F", bound=Callable[..., Any])


class ProcessMethods:
    """Mixin of :class:`Accelerator`: who runs what, when, and moving data between ranks."""

    _partial: PartialState
    gradient_state: GradientState
    flag_tensor: torch.Tensor | None
    _batch_mesh: Callable[[], Any]

    @property
    def device(self) -> torch.device:
        """The device of this process."""
        return self._partial.device

    @property
    def num_processes(self) -> int:
        """Number of processes in the launch."""
        return self._partial.num_processes

    @property
    def process_index(self) -> int:
        """This process's global index."""
        return self._partial.process_index

    @property
    def local_process_index(self) -> int:
        """This process's index on its node."""
        return self._partial.local_process_index

    @property
    def is_main_process(self) -> bool:
        """True on process 0 only."""
        return self._partial.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        """True on the first process of each node."""
        return self._partial.is_local_main_process

    @property
    def is_last_process(self) -> bool:
        """True on the last process."""
        return self._partial.is_last_process

    @property
    def use_distributed(self) -> bool:
        """True when more than one process takes part."""
        return self._partial.use_distributed

    def wait_for_everyone(self) -> None:
        """Block until every process reaches this point (no-op on one process)."""
        self._partial.wait_for_everyone()

    @contextmanager
    def main_process_first(self) -> Iterator[None]:
        """Run the block on the main process first, then on the others (e.g. downloads)."""
        with self._partial.main_process_first():
            yield

    @contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """Run the block on each node's first process first, then on the others."""
        with self._partial.local_main_process_first():
            yield

    def on_main_process(self, function: F) -> F:
        """Decorator: run ``function`` on the main process only."""
        return self._partial.on_main_process(function)

    def on_local_main_process(self, function: F) -> F:
        """Decorator: run ``function`` on each node's first process only."""
        return self._partial.on_local_main_process(function)

    def on_last_process(self, function: F) -> F:
        """Decorator: run ``function`` on the last process only."""
        return self._partial.on_last_process(function)

    def on_process(self, function: F | None = None, process_index: int | None = None) -> Any:
        """Decorator: run ``function`` on process ``process_index`` only."""
        return self._partial.on_process(function, process_index)

    def on_local_process(
        self, function: F | None = None, local_process_index: int | None = None
    ) -> Any:
        """Decorator: run ``function`` on local process ``local_process_index`` of each node."""
        return self._partial.on_local_process(function, local_process_index)

    @contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """This process's contiguous share of ``inputs`` (see ``PartialState``)."""
        with self._partial.split_between_processes(inputs, apply_padding) as share:
            yield share

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` once per node (on each node's first process)."""
        self._partial.print(*args, **kwargs)

    def gather(self, tensor: Any) -> Any:
        """Concatenate ``tensor`` (or a nested structure of tensors) from every process."""
        return ops.gather(tensor)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """Gather for evaluation: like :meth:`gather`, minus the samples that prepared loaders
        repeated to even out the last batch, so exactly the dataset's samples come back (once,
        when the ranks of a tensor parallel group shared each batch)."""
        mesh = self._batch_mesh()
        return ops.gather_for_metrics(
            input_data,
            self.gradient_state,
            self._partial.num_processes,
            use_gather_object,
            ranks_per_batch=mesh_group_size(mesh) if mesh is not None else 1,
        )

    def gather_object(self, obj: Any) -> list[Any]:
        """Every process's (picklable) ``obj``, as one list."""
        return ops.gather_object(obj)

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """Reduce ``tensor`` across processes: ``"sum"``, ``"mean"`` or ``"max"``."""
        return ops.reduce(tensor, reduction=reduction, scale=scale)

    def broadcast(self, tensor: Any, from_process: int = 0) -> Any:
        """``tensor`` as held by ``from_process``, on every process."""
        return ops.broadcast(tensor, from_process=from_process)

    def pad_across_processes(
        self, tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False
    ) -> Any:
        """Pad ``tensor`` along ``dim`` to the largest size any process has (before gather)."""
        return ops.pad_across_processes(tensor, dim=dim, pad_index=pad_index, pad_first=pad_first)

    def set_trigger(self) -> None:
        """Raise a flag on this process that :meth:`check_trigger` will see on every process."""
        self.flag_tensor = torch.tensor(1, device=self._partial.device)

    def check_trigger(self) -> bool:
        """True on every process when any process called :meth:`set_trigger` (then reset)."""
        if self.flag_tensor is None:
            self.flag_tensor = torch.tensor(0, device=self._partial.device)
        total = ops.reduce(self.flag_tensor, reduction="sum")
        if int(total.item()) >= 1:
            self.flag_tensor = torch.tensor(0, device=self._partial.device)
            return True
        return False
