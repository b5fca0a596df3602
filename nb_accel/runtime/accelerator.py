"""The ``Accelerator`` facade: a thin front over the state and, later, the wrapper modules."""

from __future__ import annotations

from typing import Any

import torch

from .state import AcceleratorState, DistributedType

__all__ = ["Accelerator"]


class Accelerator:
    """Entry point of the training-loop API inside a launched function.

    Args:
        device_placement: move prepared objects to ``device``.
        split_batches: split each batch across processes instead of sharding batches.
        mixed_precision: ``"no"``, ``"bf16"`` or ``"fp16"``; defaults to the launch's setting.
        gradient_accumulation_steps: steps between optimizer updates.
        cpu: force the CPU.
        kwargs: further Accelerate options, accepted for compatibility.
    """

    def __init__(
        self,
        device_placement: bool = True,
        split_batches: bool = False,
        mixed_precision: str | None = None,
        gradient_accumulation_steps: int = 1,
        cpu: bool = False,
        **kwargs: Any,
    ) -> None:
        self.state = AcceleratorState(mixed_precision=mixed_precision, cpu=cpu)
        self.device_placement = device_placement
        self.split_batches = split_batches
        self.gradient_accumulation_steps = gradient_accumulation_steps

    @property
    def mixed_precision(self) -> str:
        """The mixed-precision mode in use: ``"no"``, ``"bf16"`` or ``"fp16"``."""
        return self.state.mixed_precision

    @property
    def device(self) -> torch.device:
        """The device of this process."""
        return self.state.device

    @property
    def distributed_type(self) -> DistributedType:
        """The kind of distributed setup."""
        return self.state.distributed_type

    @property
    def num_processes(self) -> int:
        """Number of processes in the launch."""
        return self.state.num_processes

    @property
    def process_index(self) -> int:
        """This process's global index."""
        return self.state.process_index

    @property
    def local_process_index(self) -> int:
        """This process's index on its node."""
        return self.state.local_process_index

    @property
    def is_main_process(self) -> bool:
        """True on process 0 only."""
        return self.state.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        """True on the first process of each node."""
        return self.state.is_local_main_process

    def wait_for_everyone(self) -> None:
        """Barrier across all processes."""
        self.state.wait_for_everyone()

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the main process only."""
        self.state.print(*args, **kwargs)
