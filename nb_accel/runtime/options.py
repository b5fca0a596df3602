"""Configuration dataclasses accepted by ``Accelerator`` (same names and fields as Accelerate)."""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = [
    "DataLoaderConfiguration",
    "GradientAccumulationPlugin",
    "ProjectConfiguration",
    "DistributedDataParallelKwargs",
    "GradScalerKwargs",
    "AutocastKwargs",
]


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
        non_blocking: copy batches to the device with ``non_blocking=True``.
    """

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    non_blocking: bool = False


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


@dataclass
class DistributedDataParallelKwargs:
    """Options passed to ``DistributedDataParallel`` when a model is prepared."""

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False

    def to_kwargs(self) -> dict[str, object]:
        """The options that differ from their defaults."""
        return _changed(self)


@dataclass
class GradScalerKwargs:
    """Options for the fp16 ``GradScaler``."""

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True

    def to_kwargs(self) -> dict[str, object]:
        """The options that differ from their defaults."""
        return _changed(self)


@dataclass
class AutocastKwargs:
    """Options for ``torch.autocast`` under mixed precision."""

    enabled: bool = True
    cache_enabled: bool | None = None

    def to_kwargs(self) -> dict[str, object]:
        """The options that differ from their defaults."""
        return _changed(self)


def _changed(options: object) -> dict[str, object]:
    defaults = type(options)()
    return {
        name: value for name, value in vars(options).items() if value != getattr(defaults, name)
    }
