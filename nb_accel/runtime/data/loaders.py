"""Rebuilding a user's ``DataLoader`` for one process: ``prepare_data_loader`` and
``skip_first_batches``. The loader classes live in :mod:`~nb_accel.runtime.data.loader_shard` and
:mod:`~nb_accel.runtime.data.loader_dispatch`; samplers in :mod:`~nb_accel.runtime.data.sampling`.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from ..collectives.ops import broadcast_object_list
from ..parallelism.tensor import mesh_group_size
from ..state import PartialState
from .loader_dispatch import DataLoaderDispatcher
from .loader_resume import inherit_position
from .loader_shard import DataLoaderShard, DataLoaderStateMixin, SkipDataLoader
from .rng import RNGType
from .sampling import (
    BatchSamplerShard,
    IterableDatasetShard,
    SeedableRandomSampler,
    SkipBatchSampler,
)
from .stateful import require_stateful_dataloader

__all__ = [
    "DataLoaderShard",
    "DataLoaderStateMixin",
    "DataLoaderDispatcher",
    "SkipDataLoader",
    "prepare_data_loader",
    "skip_first_batches",
]

#: Arguments the new batch sampler (or dataset shard) takes care of.
_REPLACED = ("self", "dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "drop_last")


def _loader_kwargs(loader: DataLoader) -> dict[str, Any]:  # type: ignore[type-arg]
    """Every other ``DataLoader`` argument, as ``loader`` has it (num_workers, collate_fn, ...)."""
    parameters = inspect.signature(DataLoader.__init__).parameters
    return {
        name: getattr(loader, name, parameter.default)
        for name, parameter in parameters.items()
        if name not in _REPLACED
        and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
    }


def _batch_sampler_of(loader: DataLoader) -> tuple[Any, bool]:  # type: ignore[type-arg]
    """The loader's batch sampler, and whether it was passed as ``sampler=``."""
    if isinstance(loader.sampler, BatchSampler):
        return loader.sampler, True
    return loader.batch_sampler, False


def _agreed(seed: int, agree: bool) -> int:
    """Process 0's ``seed`` on every process (when ``agree`` and a group is up)."""
    if not agree:
        return seed
    if not dist.is_initialized() and not PartialState().device_backend.collectives_active:
        return seed
    return int(broadcast_object_list([seed])[0])


def _with_sampler(batch_sampler: Any, sampler: Any) -> Any:
    if type(batch_sampler) is BatchSampler:
        return BatchSampler(sampler, batch_sampler.batch_size, batch_sampler.drop_last)
    replaced = copy.copy(batch_sampler)
    replaced.sampler = sampler
    return replaced


def _shuffling(
    batch_sampler: Any, use_seedable_sampler: bool, data_seed: int | None, agree: bool
) -> tuple[Any, torch.Generator | None]:
    """Make shuffling agree across processes: ``(batch sampler, generator to synchronise)``."""
    sampler = getattr(batch_sampler, "sampler", None)
    if isinstance(sampler, RandomSampler) and use_seedable_sampler:
        seed = data_seed if data_seed is not None else torch.initial_seed()
        seedable = SeedableRandomSampler(
            sampler.data_source,
            replacement=sampler.replacement,
            num_samples=sampler._num_samples,
            generator=sampler.generator,
            data_seed=_agreed(int(seed), agree),
        )
        return _with_sampler(batch_sampler, seedable), None
    if sampler is None or not hasattr(sampler, "generator"):
        return batch_sampler, None
    if sampler.generator is None:  # as Accelerate: a fresh generator seeded from torch's
        seed = int(torch.empty((), dtype=torch.int64).random_().item())
        sampler.generator = torch.Generator().manual_seed(_agreed(seed, agree))
    return batch_sampler, sampler.generator


def _check_split(loader: DataLoader, num_processes: int) -> None:  # type: ignore[type-arg]
    size = loader.batch_size
    if size is None:
        size = getattr(loader.batch_sampler, "batch_size", None)
    if size is None:
        raise ValueError(
            "split_batches=True needs a batch size: the DataLoader's batch_size, or a "
            "batch_size attribute on its batch_sampler"
        )
    if size > 1 and size % num_processes:
        raise ValueError(
            f"split_batches=True needs a batch size ({size}) that is a round multiple of the "
            f"number of processes ({num_processes})"
        )


def prepare_data_loader(
    dataloader: DataLoader,  # type: ignore[type-arg]
    device: torch.device | None = None,
    num_processes: int | None = None,
    process_index: int | None = None,
    split_batches: bool = False,
    put_on_device: bool = False,
    rng_types: Sequence[RNGType | str] | None = None,
    dispatch_batches: bool | None = None,
    even_batches: bool = True,
    slice_fn_for_dispatch: Callable[..., Any] | None = None,
    use_seedable_sampler: bool = False,
    data_seed: int | None = None,
    non_blocking: bool = False,
    use_stateful_dataloader: bool = False,
    torch_device_mesh: Any = None,
) -> DataLoader:  # type: ignore[type-arg]
    """Rebuild ``dataloader`` so that this process gets its share of every batch.

    Every other argument of the loader is kept (``num_workers``, ``collate_fn``,
    ``pin_memory``, ``worker_init_fn``, ``generator``, ``persistent_workers``, ...).

    Args:
        dataloader: the loader to shard.
        device: where batches go when ``put_on_device``.
        num_processes: number of processes (default: the launch's).
        process_index: this process's index (default: the launch's).
        split_batches: split every batch across processes instead of dealing out whole
            batches (the batch size must be a multiple of ``num_processes``).
        put_on_device: move batches to ``device``.
        rng_types: generators synchronised with process 0 at every new iteration
            (``"torch"``, ``"cuda"``, ``"generator"``: the sampler's or iterable dataset's).
        dispatch_batches: load on process 0 only and send each process its slice (default:
            for iterable datasets; not available on XLA). Dispatched batches always land on
            the launch's device.
        even_batches: repeat samples from the start so every process gets the same number of
            equal batches; ``False`` repeats nothing (and allows varying batch sizes).
        slice_fn_for_dispatch: how the dispatcher cuts a process's slice.
        use_seedable_sampler: replace a ``RandomSampler`` with a
            :class:`SeedableRandomSampler` (order set by seed and epoch only).
        data_seed: the seed of that sampler (default: process 0's ``torch.initial_seed()``):
            every process uses process 0's.
        non_blocking: move batches to the device with ``non_blocking=True``.
        use_stateful_dataloader: build the loader on torchdata's ``StatefulDataLoader``: it
            then offers ``state_dict()`` and ``load_state_dict()``, and resumes with the batch
            after the last one handed out (needs ``pip install nb_accel[stateful]``).
        torch_device_mesh: the device mesh (``accelerator.torch_device_mesh``): the ranks of
            one ``tp`` (and ``cp``) group get the same batches, the loader is sharded over the
            data-parallel ranks only.

    Returns:
        A :class:`DataLoaderShard` or a :class:`DataLoaderDispatcher`.
    """
    if use_stateful_dataloader:
        require_stateful_dataloader()
    state = PartialState()
    parts = state.num_processes if num_processes is None else num_processes
    index = state.process_index if process_index is None else process_index
    group = mesh_group_size(torch_device_mesh) if torch_device_mesh is not None else 1
    parts, index = parts // group, index // group  # one place per tensor parallel group
    iterable = isinstance(dataloader.dataset, IterableDataset)
    dispatches = state.device_backend.dispatches_batches
    if dispatch_batches and not dispatches:
        raise NotImplementedError(
            f"dispatch_batches=True is not available on {state.device_backend.title}: every "
            "process loads its own shard (leave dispatch_batches unset)"
        )
    grouped = group > 1  # tensor parallel groups share batches
    if dispatch_batches and grouped:
        raise NotImplementedError(
            "dispatch_batches=True with tensor (or context) parallelism: the dispatcher deals "
            "every process a slice of its own, and the ranks of a tp group need the same "
            "batch. Leave dispatch_batches unset: each data-parallel place loads its shard"
        )
    dispatch = dispatch_batches
    if dispatch is None:  # iterable datasets, unless the ranks of a tp group share batches
        dispatch = iterable and dispatches and not grouped
    if split_batches:
        _check_split(dataloader, parts)
    source = _Source(dataloader, parts > 1 and not dispatch, use_seedable_sampler, data_seed)
    if dispatch:
        return DataLoaderDispatcher(
            source.dataset,
            split_batches=split_batches,
            _drop_last=dataloader.drop_last,
            _non_blocking=non_blocking,
            slice_fn=slice_fn_for_dispatch,
            even_batches=even_batches,
            use_stateful_dataloader=use_stateful_dataloader,
            **source.kwargs,
        )
    if parts > 1:
        source.shard(parts, index, split_batches, even_batches)
    kinds = [RNGType(kind).value for kind in rng_types or ()]
    if source.synced is None and "generator" in kinds:
        kinds.remove("generator")
    drops = dataloader.drop_last or bool(getattr(source.batch_sampler, "drop_last", False))
    shard_class = state.device_backend.shard_class(DataLoaderShard)
    return shard_class(
        source.dataset,
        device=device if put_on_device else None,
        rng_types=kinds or None,
        synchronized_generator=source.synced,
        _drop_last=drops,
        _non_blocking=non_blocking,
        use_stateful_dataloader=use_stateful_dataloader,
        **source.kwargs,
    )


class _Source:
    """What a prepared loader is rebuilt from: dataset, batch sampler and other arguments."""

    def __init__(
        self,
        loader: DataLoader,  # type: ignore[type-arg]
        agree: bool,
        seedable: bool,
        data_seed: int | None,
    ) -> None:
        self.loader = loader
        self.dataset = loader.dataset
        self.iterable = isinstance(self.dataset, IterableDataset)
        self.batch_sampler, self.passed_as_sampler = _batch_sampler_of(loader)
        self.kwargs = _loader_kwargs(loader)
        self.synced: torch.Generator | None = None
        if self.batch_sampler is not None and not self.iterable:
            self.batch_sampler, self.synced = _shuffling(
                self.batch_sampler, seedable, data_seed, agree
            )
        if self.iterable:
            self.kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
        elif self.passed_as_sampler:
            self.kwargs.update(sampler=self.batch_sampler, batch_size=None)
        elif self.batch_sampler is not None:
            self.kwargs.update(batch_sampler=self.batch_sampler)
        else:
            self.kwargs.update(sampler=loader.sampler, batch_size=None)

    def shard(self, parts: int, index: int, split: bool, even: bool) -> None:
        """Give process ``index`` its share: a sharded batch sampler, or a dataset shard."""
        size = self.loader.batch_size or 1
        if self.iterable:
            generator = getattr(self.dataset, "generator", None)
            self.synced = generator if isinstance(generator, torch.Generator) else None
            self.dataset = IterableDatasetShard(
                self.dataset,
                batch_size=size,
                drop_last=self.loader.drop_last,
                num_processes=parts,
                process_index=index,
                split_batches=split,
            )
            if split:
                self.kwargs["batch_size"] = size // parts or 1
        elif self.batch_sampler is None:
            raise ValueError("a DataLoader with batch_size=None cannot be sharded: give it one")
        else:
            shard = BatchSamplerShard(self.batch_sampler, parts, index, split, even)
            self.kwargs["sampler" if self.passed_as_sampler else "batch_sampler"] = shard


def _skipping(loader: DataLoader, skip: int) -> dict[str, Any]:  # type: ignore[type-arg]
    """The arguments that make a rebuilt ``loader`` start ``skip`` batches in."""
    kwargs = _loader_kwargs(loader)
    batch_sampler, passed_as_sampler = _batch_sampler_of(loader)
    if isinstance(loader.dataset, IterableDataset) or batch_sampler is None:
        kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
        if batch_sampler is None and not isinstance(loader.dataset, IterableDataset):
            kwargs.update(sampler=loader.sampler)
        kwargs["skip_batches"] = skip
    elif passed_as_sampler:
        kwargs.update(sampler=SkipBatchSampler(batch_sampler, skip), batch_size=None)
    else:
        kwargs["batch_sampler"] = SkipBatchSampler(batch_sampler, skip)
    return kwargs


def skip_first_batches(dataloader: DataLoader, num_batches: int = 0) -> DataLoader:  # type: ignore[type-arg]
    """A new loader that yields ``dataloader``'s batches from batch ``num_batches`` on.

    Skipped batches are not loaded (their indices are skipped), except for iterable datasets.
    Works on plain, sharded and dispatching loaders; they keep their type and settings. A
    prepared loader's epoch count, and an interrupted epoch that ``load_state`` restored, carry
    over to the new loader, which hands its epoch count back when its iteration completes.
    """
    if isinstance(dataloader, (DataLoaderDispatcher, DataLoaderShard)):
        return _prepared_copy(dataloader, num_batches)
    kwargs = _skipping(dataloader, num_batches)
    if "skip_batches" in kwargs:
        return SkipDataLoader(dataloader.dataset, **kwargs)
    return DataLoader(dataloader.dataset, **kwargs)


def _prepared_copy(
    loader: DataLoaderDispatcher | DataLoaderShard, num_batches: int
) -> DataLoaderDispatcher | DataLoaderShard:
    """A prepared ``loader`` made again with its own settings, ``num_batches`` steps further
    in, and where it stood (its epoch count, an interrupted epoch)."""
    if isinstance(loader, DataLoaderDispatcher):
        per_step = 1 if loader.split_batches else loader.state.num_processes
        loader_class: type[DataLoaderDispatcher | DataLoaderShard] = DataLoaderDispatcher
    else:
        per_step, loader_class = 1, type(loader)  # an XLA loader stays one
    kwargs = _skipping(loader, num_batches * per_step)
    if "skip_batches" in kwargs:
        kwargs["skip_batches"] = num_batches + loader.skip_batches
    rebuilt = loader_class(loader.dataset, **loader._own_settings(), **kwargs)
    inherit_position(rebuilt, loader)
    return rebuilt
