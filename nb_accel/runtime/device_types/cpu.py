"""The CPU: any number of ranks on one machine's cores, collectives through gloo."""

from __future__ import annotations

import os
from typing import ClassVar

import torch

from ..enums import DistributedType
from .interface import DeviceType

__all__ = ["CPU_VARIABLE", "CpuDevices", "in_cpu_memory"]

#: Set to ``1``, launches and ``Accelerator()`` stay on the CPU, GPUs or not (every rank of a CPU
#: launch has it, so that an ``Accelerator`` made there never looks for a GPU).
CPU_VARIABLE = "NB_ACCEL_USE_CPU"


def in_cpu_memory(device: torch.device) -> bool:
    """True for a tensor or storage on ``device`` whose bytes are in the process's own memory
    (where they can be pickled, mapped or written as they are)."""
    return device.type == CpuDevices.name


class CpuDevices(DeviceType):
    """The machine's CPU cores, shared by its ranks."""

    name: ClassVar[str] = "cpu"
    label: ClassVar[str] = "CPU"
    distributed_type: ClassVar[DistributedType] = DistributedType.MULTI_CPU

    def visible_count(self) -> int:
        """Never chosen for what it shows: the CPU is where a launch runs when nothing else is
        asked for or visible."""
        return 0

    def ranks_per_node(self, requested: int | None) -> int:
        """``requested``, else one: the cores are shared however many ranks there are."""
        return requested or 1

    def group_backend(self, cpu_collectives: bool) -> str:
        """gloo."""
        del cpu_collectives
        return "gloo"

    def describe(self, ranks: int) -> str:
        """``"CPU"``, whatever the number of ranks."""
        del ranks
        return self.label

    def worker_env(self) -> dict[str, str]:
        """:data:`CPU_VARIABLE`."""
        return {CPU_VARIABLE: "1"}

    def accelerate_env(self) -> dict[str, str]:
        """``ACCELERATE_USE_CPU=true``: Accelerate's ``MULTI_CPU`` on gloo."""
        return {"ACCELERATE_USE_CPU": "true"}

    def rank_device(self, local_rank: int) -> torch.device:
        """The CPU."""
        del local_rank
        return torch.device("cpu")

    def use_rank_device(self, local_rank: int, local_world_size: int) -> None:
        """Share the cores among the machine's ranks (unless ``OMP_NUM_THREADS`` says how many)
        and tell the libraries that read it."""
        del local_rank
        if "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world_size))
            # Accelerate keeps the count the rank chose instead of choosing (and warning) again
            os.environ["OMP_NUM_THREADS"] = str(torch.get_num_threads())
