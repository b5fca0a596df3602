"""Configuration dataclasses accepted by ``Accelerator`` (same names and fields as Accelerate)."""

from __future__ import annotations

import copy
import enum
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

__all__ = [
    "KwargsHandler",
    "HANDLER_NAMES",
    "DataLoaderConfiguration",
    "GradientAccumulationPlugin",
    "ProjectConfiguration",
    "DDPCommunicationHookType",
    "DistributedDataParallelKwargs",
    "GradScalerKwargs",
    "AutocastKwargs",
    "ProfileKwargs",
    "InitProcessGroupKwargs",
]


class KwargsHandler:
    """The base of the kwargs handlers (``GradScalerKwargs``, ``AutocastKwargs``, ...), as in
    Accelerate: a dataclass that subclasses it gets :meth:`to_kwargs` and :meth:`to_dict`."""

    def to_dict(self) -> dict[str, Any]:
        """Every field with its value (copies: changing them leaves the handler as it is)."""
        return copy.deepcopy(_fields(self))

    def to_kwargs(self) -> dict[str, Any]:
        """The fields whose values differ from those of a handler made without arguments."""
        return _changed(self)


@dataclass
class DataLoaderConfiguration:
    """How prepared data loaders shard data across processes.

    Attributes:
        split_batches: split each batch of the original loader across processes (the batch size
            stays the same whatever the number of processes) instead of giving each process
            whole batches (the effective batch size is then ``batch_size * num_processes``).
        dispatch_batches: iterate the loader on the main process only and send each process its
            slice; defaults to True for an ``IterableDataset``, else False.
        even_batches: when the batches do not divide evenly among processes, repeat samples
            from the start so every process gets the same number of batches.
        use_seedable_sampler: replace a ``RandomSampler`` by a ``SeedableRandomSampler`` so the
            order depends only on the seed and the epoch (exact resumption).
        data_seed: the seed of that ``SeedableRandomSampler``: launches with the same seed see
            the same order, on every process; ``None`` takes process 0's
            ``torch.initial_seed()`` (set it with ``set_seed``).
        non_blocking: copy batches to the device with ``non_blocking=True``.
        use_stateful_dataloader: build prepared loaders on torchdata's ``StatefulDataLoader``:
            they offer ``state_dict()`` and ``load_state_dict()``, and a loader resumed from its
            state continues with the next batch (needs ``pip install nb_accel[stateful]``).
    """

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False

    def __post_init__(self) -> None:
        if self.use_stateful_dataloader:
            from .data.stateful import require_stateful_dataloader

            require_stateful_dataloader()


@dataclass
class GradientAccumulationPlugin:
    """Gradient accumulation settings.

    Attributes:
        num_steps: batches whose gradients are summed before each optimizer step.
        adjust_scheduler: count the skipped steps for the learning-rate scheduler.
        sync_with_dataloader: force a synchronising step at the end of each data loader.
        sync_each_batch: synchronise gradients on every batch even while accumulating (less
            memory on GPUs, more communication).
    """

    num_steps: int = 1
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False

    def __post_init__(self) -> None:
        if self.num_steps is None or int(self.num_steps) < 1:
            raise ValueError(
                f"GradientAccumulationPlugin(num_steps={self.num_steps!r}): use an integer >= 1"
            )


@dataclass
class ProjectConfiguration:
    """Where a project keeps its checkpoints and logs.

    Attributes:
        project_dir: the project's folder.
        logging_dir: folder for logs; defaults to ``project_dir``.
        automatic_checkpoint_naming: save states as ``project_dir/checkpoints/checkpoint_<n>``.
        total_limit: keep at most this many automatic checkpoints (oldest removed first).
        iteration: the lowest number the next automatic checkpoint gets (it is numbered past
            the checkpoints already in the folder).
        save_on_each_node: write shared files on every node, not only the main process.
    """

    project_dir: str | None = None
    logging_dir: str | None = None
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0
    save_on_each_node: bool = False

    def __post_init__(self) -> None:
        if self.logging_dir is None:
            self.logging_dir = self.project_dir
        if self.total_limit is not None and self.total_limit < 1:
            raise ValueError(
                f"ProjectConfiguration(total_limit={self.total_limit}): use >= 1 or None"
            )

    def set_directories(self, project_dir: str | os.PathLike[str] | None = None) -> None:
        """Set ``project_dir`` (and ``logging_dir`` when it was not chosen separately)."""
        previous = self.project_dir
        self.project_dir = None if project_dir is None else os.fspath(project_dir)
        if self.logging_dir in (None, previous):
            self.logging_dir = self.project_dir


class DDPCommunicationHookType(str, enum.Enum):
    """A ``DistributedDataParallel`` communication hook: how gradients travel between processes.

    ``NO`` (plain all-reduce), ``FP16`` and ``BF16`` (gradients compressed to half precision for
    the all-reduce), ``POWER_SGD`` and ``BATCHED_POWER_SGD`` (low-rank gradient compression).
    ``FP16`` and ``BF16`` also serve as ``comm_wrapper`` around a PowerSGD hook.
    """

    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"

    def __str__(self) -> str:
        return str(self.value)


_COMM_FIELDS = ("comm_hook", "comm_wrapper", "comm_state_option")


@dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Options passed to ``DistributedDataParallel`` when a model is prepared.

    Attributes:
        comm_hook: the communication hook registered on the wrapped model (a
            :class:`DDPCommunicationHookType` or its value, such as ``"fp16"``).
        comm_wrapper: ``"fp16"`` or ``"bf16"`` to compress what ``comm_hook`` sends (useful
            around PowerSGD).
        comm_state_option: keyword arguments for torch's ``PowerSGDState`` (such as
            ``matrix_approximation_rank`` or ``start_powerSGD_iter``); PowerSGD hooks only.
    """

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_hook: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_wrapper: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_state_option: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        try:
            self.comm_hook = DDPCommunicationHookType(self.comm_hook)
            self.comm_wrapper = DDPCommunicationHookType(self.comm_wrapper)
        except ValueError as error:
            choices = ", ".join(repr(kind.value) for kind in DDPCommunicationHookType)
            raise ValueError(
                f"DistributedDataParallelKwargs: {error}; use one of {choices}."
            ) from None
        if self.comm_wrapper not in _WRAPPERS:
            raise ValueError(
                f"DistributedDataParallelKwargs: comm_wrapper={self.comm_wrapper.value!r} is not a "
                "wrapper; use 'no', 'fp16' or 'bf16'."
            )

    def to_dict(self) -> dict[str, Any]:
        """The ``DistributedDataParallel`` constructor's options (the hook settings left out)."""
        return {name: value for name, value in vars(self).items() if name not in _COMM_FIELDS}

    def to_kwargs(self) -> dict[str, Any]:
        """The options that differ from their defaults.

        Holds the hook settings too when they are set: preparing a model passes the rest to
        ``DistributedDataParallel`` and registers the hook with :meth:`register_comm_hook`.
        """
        return _changed(self)

    def register_comm_hook(self, model: Any) -> None:
        """Register the chosen communication hook on ``model``, a ``DistributedDataParallel``."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        hooks: dict[DDPCommunicationHookType, Any] = {
            DDPCommunicationHookType.FP16: default_hooks.fp16_compress_hook,
            DDPCommunicationHookType.BF16: default_hooks.bf16_compress_hook,
            DDPCommunicationHookType.POWER_SGD: powerSGD_hook.powerSGD_hook,
            DDPCommunicationHookType.BATCHED_POWER_SGD: powerSGD_hook.batched_powerSGD_hook,
        }
        wrappers: dict[DDPCommunicationHookType, Any] = {
            DDPCommunicationHookType.FP16: default_hooks.fp16_compress_wrapper,
            DDPCommunicationHookType.BF16: default_hooks.bf16_compress_wrapper,
        }
        hook = hooks.get(self.comm_hook)
        if hook is None:
            return
        if self.comm_wrapper in wrappers:
            hook = wrappers[self.comm_wrapper](hook)
        state = None
        if self.comm_hook in (
            DDPCommunicationHookType.POWER_SGD,
            DDPCommunicationHookType.BATCHED_POWER_SGD,
        ):
            state = powerSGD_hook.PowerSGDState(None, **self.comm_state_option)
        model.register_comm_hook(state=state, hook=hook)


_WRAPPERS = (
    DDPCommunicationHookType.NO,
    DDPCommunicationHookType.FP16,
    DDPCommunicationHookType.BF16,
)


@dataclass
class GradScalerKwargs(KwargsHandler):
    """Options for the fp16 ``GradScaler``."""

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


@dataclass
class AutocastKwargs(KwargsHandler):
    """Options for ``torch.autocast`` under mixed precision."""

    enabled: bool = True
    cache_enabled: bool | None = None


@dataclass
class ProfileKwargs(KwargsHandler):
    """Options of the ``torch.profiler.profile`` that ``accelerator.profile()`` runs.

    Attributes:
        activities: what to profile: ``"cpu"`` and/or ``"cuda"`` (None: torch's default).
        schedule_option: keyword arguments for ``torch.profiler.schedule`` (``wait``, ``warmup``,
            ``active``, ``repeat``, ``skip_first``); call ``prof.step()`` after each step.
        on_trace_ready: called with the profiler whenever the schedule finishes recording.
        record_shapes: record the operators' input shapes.
        profile_memory: track tensor memory allocation and release.
        with_stack: record the source file and line of each operator.
        with_flops: estimate the FLOPs of the operators that have a formula.
        with_modules: record the module hierarchy of each operator.
        output_trace_dir: a folder where each process writes its Chrome trace,
            ``profile_<process index>.json``, when the profiled block ends.
    """

    activities: list[str] | None = None
    schedule_option: dict[str, int] | None = None
    on_trace_ready: Callable[..., Any] | None = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: str | None = None

    def build(self) -> Any:
        """A new ``torch.profiler.profile`` with these options (not yet started)."""
        import torch.profiler

        known = {
            "cpu": torch.profiler.ProfilerActivity.CPU,
            "cuda": torch.profiler.ProfilerActivity.CUDA,
        }
        activities = None
        if self.activities is not None:
            unknown = [a for a in self.activities if a not in known]
            if unknown:
                raise ValueError(
                    f"ProfileKwargs: unknown profiler activity {unknown[0]!r}; use 'cpu' or 'cuda'."
                )
            activities = [known[a] for a in self.activities]
        schedule = None
        if self.schedule_option is not None:
            schedule = torch.profiler.schedule(**self.schedule_option)
        return torch.profiler.profile(
            activities=activities,
            schedule=schedule,
            on_trace_ready=self.on_trace_ready,
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
            with_flops=self.with_flops,
            with_modules=self.with_modules,
        )


@dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """Process-group options, for ``Accelerator(kwargs_handlers=[...])``.

    In a launch the process group exists before the function runs: ``timeout`` then applies to
    the collectives issued after the ``Accelerator`` is created, and ``backend`` must name the
    backend the launch uses (nccl on GPUs, gloo with ``cpu=True``) or be left out. Under
    ``torchrun`` the ``Accelerator`` creates the group with these options.

    Attributes:
        backend: the ``torch.distributed`` backend (Accelerate's default, ``"nccl"``, means
            "the launch's backend").
        init_method: where processes meet (used only when the ``Accelerator`` creates the group).
        timeout: how long a collective may wait for the other processes before failing;
            defaults to 10 minutes for nccl and 30 for other backends.
    """

    backend: str | None = "nccl"
    init_method: str | None = None
    timeout: timedelta | None = None

    def __post_init__(self) -> None:
        self._timeout_given = self.timeout is not None
        if self.timeout is None:
            self.timeout = timedelta(seconds=600 if self.backend == "nccl" else 1800)

    def to_kwargs(self) -> dict[str, Any]:
        """The options that differ from their defaults."""
        defaults = InitProcessGroupKwargs()
        return {
            name: getattr(self, name)
            for name in ("backend", "init_method", "timeout")
            if getattr(self, name) != getattr(defaults, name)
        }

    @property
    def chosen_timeout(self) -> timedelta | None:
        """``timeout`` when it was given, ``None`` when it is the backend's default."""
        return self.timeout if self._timeout_given else None


def _fields(options: object) -> dict[str, Any]:
    """The public attributes of ``options`` (its dataclass fields)."""
    return {name: value for name, value in vars(options).items() if not name.startswith("_")}


def _changed(options: object) -> dict[str, Any]:
    defaults = type(options)()
    return {
        name: value for name, value in _fields(options).items() if value != getattr(defaults, name)
    }


#: The kwargs handlers the ``Accelerator`` uses, by class name (Accelerate's own classes of
#: these names are taken too).
HANDLER_NAMES = (
    "DistributedDataParallelKwargs",
    "GradScalerKwargs",
    "AutocastKwargs",
    "InitProcessGroupKwargs",
    "ProfileKwargs",
)
