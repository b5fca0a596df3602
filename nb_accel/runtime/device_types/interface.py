"""The device type interface: what kind of device a launch's ranks run on, asked on both sides.

The kernel's launch plan asks a :class:`DeviceType` what it needs before any process starts:
how many devices are visible (without initialising them), how many ranks a node runs, the
process group's backend, how the launch is titled, which start methods still work, what to
advise and which variables every rank gets. Inside a worker the same type gives the rank its
device, makes it current, binds the process group to it, seeds its generator, gives and takes
its generators' states, says which mixed precisions it runs, where a collective's bookkeeping
tensors go and whether its collectives must be aborted for a failed peer, copies a logged
tensor off it without waiting, and empties its cache. Nothing else in nb_accel asks which
device type it has.

A type is one subclass; :mod:`.registry` holds them by :attr:`DeviceType.name`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..enums import DistributedType
from .group_backends import backend_for

__all__ = ["DeviceAdvice", "DeviceType", "FirstUse"]


@dataclass(frozen=True)
class DeviceAdvice:
    """What a launch on these devices should say and set: one-line notes shown when it starts,
    and variables its ranks get."""

    notes: tuple[str, ...] = ()
    worker_env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class FirstUse:
    """The first call in this process that could have initialised a device type.

    Attributes:
        function: what was called, in words (``torch.cuda.is_available()``).
        stack: where from: ``(file, line, function)`` of each frame, outermost first.
    """

    function: str
    stack: tuple[tuple[str, int, str], ...]


class DeviceType(ABC):
    """One kind of device (the CPU, CUDA GPUs, ...), for the kernel and for the workers.

    The kernel's side never initialises a device: a kernel that did could not fork workers
    that use it.
    """

    #: torch's name for it: the ``type`` of a rank's ``torch.device`` (``"cpu"``, ``"cuda"``).
    name: ClassVar[str]
    #: How one device is named to the user (``"CPU"``, ``"GPU"``).
    label: ClassVar[str]
    #: Accelerate's distributed type of a launch of several ranks on it.
    distributed_type: ClassVar[DistributedType]
    #: What a process initialises to use it, in messages (``"CUDA"``; ``""``: nothing).
    runtime: ClassVar[str] = ""
    #: The calls that start using it, for messages that say to keep them out of the kernel.
    first_calls: ClassVar[str] = ""
    #: True when :meth:`first_use` records the first call that could initialise it (from
    #: nb_accel's import on), so that a kernel that did can be told which line.
    tracks_first_use: ClassVar[bool] = False
    #: True when its ranks join a ``torch.distributed`` process group (what FSDP2 shards over).
    process_group: ClassVar[bool] = True
    #: The launch backend its launches need, by name (``None``: whichever suits the options).
    launcher: ClassVar[str | None] = None
    #: The mixed precisions it runs (``None``: every one nb_accel knows).
    precisions: ClassVar[tuple[str, ...] | None] = None
    #: The start methods its workers can have (``None``: every one the platform offers).
    start_methods: ClassVar[tuple[str, ...] | None] = None
    #: The resource a cluster's scheduler counts one rank of it in (Ray's ``"CPU"``, ``"GPU"``).
    cluster_resource: ClassVar[str] = "CPU"
    #: True when torch's context parallelism (``ParallelismConfig(cp_size=...)``) runs on it.
    context_parallel: ClassVar[bool] = False

    # --- the kernel's side --------------------------------------------------------------------

    def requested(self, environ: Mapping[str, str]) -> bool:
        """True when ``environ`` asks for this device type whatever else is visible (a TPU
        runtime asks for XLA); the others are chosen by what is visible."""
        del environ
        return False

    @abstractmethod
    def visible_count(self) -> int:
        """How many of these devices this process sees, counted without initialising them
        (0: none, and a launch does not choose this type unless asked)."""

    def ranks_per_node(self, requested: int | None) -> int:
        """The ranks one machine runs: ``requested``, else one per visible device; a
        ``ValueError`` saying what works when there are not that many devices."""
        visible = self.visible_count()
        count = requested or visible
        if count > visible:
            many = f"{visible} {self.label}{'s are' if visible != 1 else ' is'}"
            raise ValueError(
                f"num_processes={count} but only {many} visible; use num_processes<={visible}, "
                f"or cpu=True to run {count} processes on the CPU"
            )
        return count

    @abstractmethod
    def group_backend(self, cpu_collectives: bool) -> str:
        """The backend of the launch's process group; with ``cpu_collectives``, one that runs
        collectives on CPU tensors too (``"cuda:nccl,cpu:gloo"``)."""

    def describe(self, ranks: int) -> str:
        """Where ``ranks`` ranks run, in words: ``"2 GPUs"``."""
        return f"{ranks} {self.label}{'s' if ranks != 1 else ''}"

    def describe_launch(self, ranks: int, backend: str) -> tuple[str, str]:
        """The launch's title in two parts: what runs where (``"2 processes on 2 GPUs"``), and
        what runs the collectives (``backend``)."""
        plural = "es" if ranks > 1 else ""
        return f"{ranks} process{plural} on {self.describe(ranks)}", backend

    def forks_safely(self) -> bool:
        """False when a worker forked from this process now could not use these devices (the
        kernel initialised them)."""
        return True

    def first_use(self) -> FirstUse | None:
        """The first call that could have initialised these devices in this process, where it
        was recorded."""
        return None

    def advice(self, ranks: int, precision: str, environ: Mapping[str, str]) -> DeviceAdvice:
        """Notes and variables for a launch of ``ranks`` ranks in ``precision`` on these
        devices (nothing by default)."""
        del ranks, precision, environ
        return DeviceAdvice()

    def worker_env(self) -> dict[str, str]:
        """Variables every rank of a launch on these devices gets (on top of the kernel's)."""
        return {}

    def accelerate_env(self) -> dict[str, str]:
        """What makes 🤗 Accelerate's own state (and the 🤗 Trainer) use these devices."""
        return {"ACCELERATE_USE_CPU": "false"}

    # --- the worker's side --------------------------------------------------------------------

    @abstractmethod
    def rank_device(self, local_rank: int) -> torch.device:
        """The device of the rank with index ``local_rank`` on its machine."""

    def use_rank_device(self, local_rank: int, local_world_size: int) -> None:
        """Make the rank's device its current one, before the process group is made
        (``local_world_size`` ranks share the machine)."""
        del local_rank, local_world_size

    def bound_device(self, local_rank: int) -> torch.device | None:
        """The device the process group is bound to (``init_process_group(device_id=...)``),
        so that it connects when made rather than at the first collective; ``None``: unbound."""
        del local_rank
        return None

    def model_device_ids(self, device: torch.device) -> list[int] | None:
        """``DistributedDataParallel``'s ``device_ids`` for a model on ``device``."""
        del device
        return None

    def seed(self, seed: int) -> None:
        """Seed the devices' own generators (``torch.manual_seed`` seeds the CPU's, and
        CUDA's, already)."""
        del seed

    def empty_cache(self) -> None:  # noqa: B027 - most devices cache nothing
        """Give the memory the device's allocator caches back (``free_memory``)."""

    def supports_precision(self, precision: str) -> bool:
        """True when an ``Accelerator`` on these devices runs ``mixed_precision=precision``
        (one of :attr:`precisions`; fp16 needs torch's float16 autocast and a ``GradScaler``
        for the device)."""
        return self.precisions is None or precision in self.precisions

    def rng_state(self) -> torch.Tensor | None:
        """The state of the rank's (current) device's own random generator, for
        ``synchronize_rng_state``; ``None``: it has none apart from torch's CPU generator."""
        return None

    def set_rng_state(self, state: torch.Tensor) -> None:  # noqa: B027 - no generator by default
        """Give the rank's (current) device's generator ``state`` (:meth:`rng_state`'s)."""

    def saved_rng_states(self) -> list[torch.Tensor] | None:
        """Every one of these devices' generator states, for a checkpoint; ``None``: nothing to
        save (no generator of their own, or none in use in this process)."""
        return None

    def restore_rng_states(self, states: list[torch.Tensor]) -> None:  # noqa: B027
        """Give these devices' generators the states :meth:`saved_rng_states` returned (nothing
        to do by default: there was nothing to save)."""

    def collective_device(self, backend: str | None, device: torch.device) -> torch.device:
        """Where a rank on ``device`` puts small tensors it exchanges through a group made as
        ``backend`` (generator states, the dispatcher's messages): ``device`` where the group
        runs collectives on these devices, else the CPU."""
        return device if backend_for(backend, self.name) is not None else torch.device("cpu")

    def detached_collectives(self, backend: str | None) -> bool:
        """True when a group made as ``backend`` runs its collectives on these devices apart
        from the Python call that issued them (NCCL on GPUs): a rank waiting in one is not
        freed when a failed peer's connections close, so it must be aborted, and only the
        backend says whether one finished. False by default: the call itself waits, and fails
        with the connection."""
        del backend
        return False

    def copy_to_host(self, tensor: torch.Tensor) -> tuple[torch.Tensor, Callable[[], None] | None]:
        """Start copying ``tensor`` (detached, on one of these devices) where it can be read
        later without the caller waiting for the device now: the copy, and what to call before
        reading it (``None``: nothing). By default a clone, where it is."""
        return tensor.clone(), None
