"""Who am I: process index, world size, device and backend, built from the environment.

State is shared between instances of a class (as in Accelerate) and rebuilt in every worker at
the start of a launch, so nothing created in the kernel leaks into a launch or survives it.
"""

from __future__ import annotations

import enum
import os
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from .. import _env

__all__ = ["DistributedType", "PartialState", "AcceleratorState", "MIXED_PRECISION_CHOICES"]

MIXED_PRECISION_CHOICES = ("no", "bf16", "fp16")


class DistributedType(str, enum.Enum):
    """The kind of distributed setup the current process runs in."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    XLA = "XLA"


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


class PartialState:
    """The process's place in the launch: index, count, device and distributed type.

    Every instance shares one state (create as many as you like). Outside a launch it describes
    a single process; inside a worker it describes that worker's rank.

    Args:
        cpu: force the CPU even when GPUs are present.
    """

    _shared_state: ClassVar[dict[str, Any]] = {}

    def __init__(self, cpu: bool = False, **kwargs: Any) -> None:
        self.__dict__ = self._shared_state
        if self._shared_state.get("initialized"):
            return
        backend = os.environ.get("NB_ACCEL_BACKEND")
        world_size = _env_int("WORLD_SIZE", 1)
        if dist.is_available() and dist.is_initialized():
            world_size = dist.get_world_size()
            backend = dist.get_backend()
        elif world_size > 1 and dist.is_available():
            # Started by torchrun or another launcher that did not create the group yet.
            backend = backend or ("nccl" if self._use_cuda(cpu) else "gloo")
            dist.init_process_group(backend=backend)
        self.backend: str | None = backend if world_size > 1 else None
        self.num_processes: int = world_size
        self.process_index: int = dist.get_rank() if dist.is_initialized() else 0
        self.local_process_index: int = _env_int("LOCAL_RANK", 0)
        self.num_local_processes: int = _env_int("LOCAL_WORLD_SIZE", world_size)
        use_cuda = backend == "nccl" or (backend is None and self._use_cuda(cpu))
        if use_cuda:
            self.device = torch.device("cuda", self.local_process_index)
        else:
            self.device = torch.device("cpu")
        if world_size > 1:
            self.distributed_type = (
                DistributedType.MULTI_GPU if use_cuda else DistributedType.MULTI_CPU
            )
        else:
            self.distributed_type = DistributedType.NO
        self.initialized = True

    @staticmethod
    def _use_cuda(cpu: bool) -> bool:
        if cpu or os.environ.get("NB_ACCEL_USE_CPU") == "1":
            return False
        return _env.cuda_device_count() > 0

    @classmethod
    def _reset_state(cls) -> None:
        """Forget the shared state (done at the start of every worker)."""
        cls._shared_state.clear()

    @property
    def initialized(self) -> bool:
        """True once the state has been built."""
        return bool(self._shared_state.get("initialized"))

    @initialized.setter
    def initialized(self, value: bool) -> None:
        self._shared_state["initialized"] = value

    @property
    def use_distributed(self) -> bool:
        """True when more than one process takes part."""
        return self.num_processes > 1

    @property
    def is_main_process(self) -> bool:
        """True on the process with index 0 only."""
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        """True on the first process of each node."""
        return self.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        """True on the process with the highest index."""
        return self.process_index == self.num_processes - 1

    def wait_for_everyone(self) -> None:
        """Block until every process reaches this point (a barrier)."""
        if self.use_distributed and dist.is_initialized():
            dist.barrier()

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the main process only."""
        if self.is_main_process:
            print(*args, **kwargs)

    def __repr__(self) -> str:
        return (
            f"Distributed environment: {self.distributed_type.value}"
            f"{f'  Backend: {self.backend}' if self.backend else ''}\n"
            f"Num processes: {self.num_processes}\n"
            f"Process index: {self.process_index}\n"
            f"Local process index: {self.local_process_index}\n"
            f"Device: {self.device}\n"
        )


class AcceleratorState:
    """The :class:`PartialState` plus the training options that every instance shares.

    Args:
        mixed_precision: ``"no"``, ``"bf16"`` or ``"fp16"``; defaults to the launch's setting.
        cpu: force the CPU.
    """

    _shared_state: ClassVar[dict[str, Any]] = {}

    def __init__(
        self, mixed_precision: str | None = None, cpu: bool = False, **kwargs: Any
    ) -> None:
        self.__dict__ = self._shared_state
        if self._shared_state.get("initialized"):
            if mixed_precision is not None and mixed_precision != self.mixed_precision:
                raise ValueError(
                    f"AcceleratorState already uses mixed_precision={self.mixed_precision!r}; "
                    "create the Accelerator with that value (or none) rather than "
                    f"{mixed_precision!r}"
                )
            return
        chosen = (
            mixed_precision
            or os.environ.get("NB_ACCEL_MIXED_PRECISION")
            or os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
        )
        chosen = str(chosen).lower()
        if chosen not in MIXED_PRECISION_CHOICES:
            raise ValueError(
                f"mixed_precision={chosen!r} is not supported; use one of {MIXED_PRECISION_CHOICES}"
            )
        self.partial = PartialState(cpu=cpu)
        self.mixed_precision: str = chosen
        self._shared_state["initialized"] = True

    @classmethod
    def _reset_state(cls) -> None:
        """Forget the shared state (done at the start of every worker)."""
        cls._shared_state.clear()

    def __getattr__(self, name: str) -> Any:
        # Delegate the PartialState attributes (device, process_index, ...).
        partial = self.__dict__.get("partial")
        if partial is None:
            raise AttributeError(name)
        return getattr(partial, name)


def reset_all_states() -> None:
    """Forget every shared state; the next instances are rebuilt from the environment."""
    PartialState._reset_state()
    AcceleratorState._reset_state()
