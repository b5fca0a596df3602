"""Which samples each process sees: pure samplers and dataset wrappers, one instance per rank.

Nothing here talks to other processes; a shard is a function of the wrapped sampler or dataset,
``num_processes`` and ``process_index``, so every rank's share can be checked in one process.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import BatchSampler, IterableDataset, RandomSampler

__all__ = [
    "SeedableRandomSampler",
    "BatchSamplerShard",
    "IterableDatasetShard",
    "SkipBatchSampler",
]


class SeedableRandomSampler(RandomSampler):
    """A ``RandomSampler`` whose order depends only on a seed and the epoch.

    Every iteration reseeds the generator with ``initial_seed + epoch``, so processes that share
    ``initial_seed`` draw the same permutation, and :meth:`set_epoch` (or finishing an
    iteration, which moves to the next epoch) changes it.

    Args:
        data_source: the dataset to sample from.
        replacement: draw with replacement.
        num_samples: samples per epoch (default: the dataset's length).
        generator: the generator to reseed (default: a new CPU generator).
        data_seed: the seed (default: ``torch.initial_seed()`` of this process).
    """

    def __init__(
        self,
        data_source: Sized,
        replacement: bool = False,
        num_samples: int | None = None,
        generator: torch.Generator | None = None,
        data_seed: int | None = None,
    ) -> None:
        super().__init__(
            data_source, replacement=replacement, num_samples=num_samples, generator=generator
        )
        self.initial_seed = int(data_seed if data_seed is not None else torch.initial_seed())
        self.epoch = 0
        if self.generator is None:  # made now, so a checkpoint finds it before any iteration
            self.generator = torch.Generator()

    def __iter__(self) -> Iterator[int]:
        assert self.generator is not None
        self.generator.manual_seed((self.initial_seed + self.epoch) % 2**63)
        yield from super().__iter__()
        self.set_epoch(self.epoch + 1)

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s permutation from the next iteration on."""
        self.epoch = epoch


def _sampler_length(batch_sampler: Any) -> int | None:
    sampler = getattr(batch_sampler, "sampler", None)
    try:
        return len(sampler)  # type: ignore[arg-type]
    except TypeError:
        return None


class _WrappingBatchSampler(BatchSampler):
    """Base of the batch samplers that wrap another: its batch size, drop_last and sampler."""

    def __init__(self, batch_sampler: Any) -> None:  # no super().__init__: nothing to build
        self.batch_sampler = batch_sampler
        self.batch_size: int | None = getattr(batch_sampler, "batch_size", None)  # type: ignore[assignment]
        self.drop_last: bool = bool(getattr(batch_sampler, "drop_last", False))

    @property
    def sampler(self) -> Any:  # type: ignore[override]
        """The sampler of the wrapped batch sampler (``None`` if it has none)."""
        return getattr(self.batch_sampler, "sampler", None)

    @property
    def total_length(self) -> int:
        """Number of batches of the wrapped batch sampler (skipped ones and every process's)."""
        return len(self.batch_sampler)

    def set_epoch(self, epoch: int) -> None:
        """Pass ``epoch`` on to the wrapped batch sampler when it takes one."""
        set_epoch = getattr(self.batch_sampler, "set_epoch", None)
        if set_epoch is not None:
            set_epoch(epoch)


class BatchSamplerShard(_WrappingBatchSampler):
    """Process ``process_index``'s share of the batches of ``batch_sampler``.

    Without ``split_batches`` each process takes whole batches in turn (batch ``i`` goes to
    process ``i % num_processes``); with it every batch is cut into ``num_processes`` equal
    slices. With ``even_batches`` (the default) every process gets the same number of
    equal-sized batches: the last ones are completed with indices from the start; with the
    batch sampler's ``drop_last`` the incomplete round is dropped instead. With
    ``even_batches=False`` nothing is repeated: some processes may get one batch fewer, or a
    shorter last batch; batch samplers with varying batch sizes (no ``batch_size``) need it.

    Args:
        batch_sampler: the batch sampler to shard.
        num_processes: number of processes.
        process_index: this process's index.
        split_batches: slice every batch instead of dealing whole batches.
        even_batches: complete the last batches so every process gets as many as the others.
    """

    def __init__(
        self,
        batch_sampler: Any,
        num_processes: int = 1,
        process_index: int = 0,
        split_batches: bool = False,
        even_batches: bool = True,
    ) -> None:
        if num_processes < 1 or not 0 <= process_index < num_processes:
            raise ValueError(
                f"process_index={process_index} must be in [0, num_processes={num_processes})"
            )
        super().__init__(batch_sampler)
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches
        if self.batch_size is None and split_batches:
            raise ValueError(
                "this batch sampler has no batch_size (its batches may vary in size), so its "
                "batches cannot be split: use split_batches=False with it"
            )
        if split_batches and self.batch_size is not None and self.batch_size % num_processes:
            raise ValueError(
                f"split_batches needs a batch size ({self.batch_size}) that is a round multiple of "
                f"the number of processes ({num_processes})"
            )

    def __len__(self) -> int:
        total = len(self.batch_sampler)
        if self.split_batches:
            last = self._last_batch_size()
            uneven = not (self.even_batches or self.drop_last)
            starts_after = last is not None and 0 < last <= self._slice().start
            return total - 1 if uneven and starts_after else total
        rounds, extra = divmod(total, self.num_processes)
        if extra == 0 or self.drop_last:
            return rounds
        if self.even_batches:
            return rounds + 1
        return rounds + (1 if self.process_index < extra else 0)

    def __iter__(self) -> Iterator[list[int]]:
        return self._iter_split() if self.split_batches else self._iter_whole()

    def _slice(self) -> slice:
        per = (self.batch_size or 0) // self.num_processes
        return slice(self.process_index * per, (self.process_index + 1) * per)

    def _last_batch_size(self) -> int | None:
        """Size of the wrapped sampler's short last batch, 0 if none, ``None`` if unknown."""
        samples = _sampler_length(self.batch_sampler)
        if samples is None or not self.batch_size or self.drop_last:
            return None if samples is None else 0
        return samples % self.batch_size

    def _iter_split(self) -> Iterator[list[int]]:
        own = self._slice()
        assert self.batch_size is not None
        head: list[int] | None = None
        last: list[int] | None = None
        for batch in self.batch_sampler:
            head = list(batch) if head is None else head
            last = list(batch)
            if len(batch) == self.batch_size:
                yield last[own]
        if self.drop_last or head is None or last is None or len(last) == self.batch_size:
            return
        if not self.even_batches:
            if len(last) > own.start:
                yield last[own]
            return
        while len(head) < self.batch_size:
            head = head + head
        yield (last + head)[own]

    def _iter_whole(self) -> Iterator[list[int]]:
        n, me = self.num_processes, self.process_index
        head: list[int] = []
        firsts: list[list[int]] = []  # the first batches, to complete batches of varying sizes
        pending: list[int] | None = None
        last: list[int] = []
        count = 0
        for index, batch in enumerate(self.batch_sampler):
            if index < n and not self.drop_last:
                head.extend(batch)
                firsts.append(list(batch))
            if index % n == me:
                pending = list(batch)
            last, count = list(batch), index + 1
            full = self.batch_size is None or len(batch) == self.batch_size
            if index % n == n - 1 and full:
                if pending is not None:
                    yield pending
                pending = None
        if self.drop_last or not firsts:
            return
        if not self.even_batches:
            if pending:
                yield pending
            return
        if self.batch_size is None:
            yield from self._complete_with_batches(pending, count, firsts)
        else:
            yield from self._complete_round(pending, last, count, head)

    def _complete_with_batches(
        self, pending: list[int] | None, count: int, firsts: list[list[int]]
    ) -> Iterator[list[int]]:
        """Batches of varying sizes: finish the last round with whole batches from the start."""
        n, me = self.num_processes, self.process_index
        if pending is not None:
            yield pending
        while len(firsts) < n:
            firsts = firsts + firsts
        for offset, index in enumerate(range(count, -(-count // n) * n)):
            if index % n == me:
                yield firsts[offset]

    def _complete_round(
        self, pending: list[int] | None, last: list[int], count: int, head: list[int]
    ) -> Iterator[list[int]]:
        """Finish the last round with indices from the start, so every process gets a batch."""
        n, me, size = self.num_processes, self.process_index, self.batch_size
        assert size is not None
        if pending is not None and len(pending) == size:
            yield pending
        while len(head) < n * size:
            head = head + head
        index, partial = (count - 1, last) if len(last) < size else (count, [])
        cursor = 0
        while index % n != 0 or partial:
            need = size - len(partial)
            batch = partial + head[cursor : cursor + need]
            cursor += need
            if index % n == me:
                yield batch
            partial = []
            index += 1

    def uneven_ranks_at(self, step: int) -> tuple[int, ...] | None:
        """The processes that hold a batch at ``step`` when their batches may differ in size.

        ``None`` when every process holds a batch of the same size at that step (always the
        case with ``even_batches``). Used to gather metrics without repeats or hangs.
        """
        n = self.num_processes
        if n == 1 or (self.even_batches and self.batch_size is not None):
            return None
        everyone = tuple(range(n))
        if self.even_batches:  # batches of varying sizes, the last round completed
            return everyone
        last = self._last_batch_size()
        total = len(self.batch_sampler)
        if self.split_batches:
            if not last or step != total - 1:
                return None
            per = self._slice().stop - self._slice().start
            return tuple(range(min(n, math.ceil(last / per))))
        rounds, extra = divmod(total, n)
        if step < rounds:
            ends_short = bool(last) and extra == 0 and step == rounds - 1
            return everyone if self.batch_size is None or ends_short else None
        if step == rounds and extra and not self.drop_last:
            return tuple(range(extra))
        return None


class IterableDatasetShard(IterableDataset):  # type: ignore[type-arg]
    """Process ``process_index``'s share of the samples of an iterable dataset.

    Samples are read in groups of the real batch size (``batch_size`` with ``split_batches``,
    else ``batch_size * num_processes``); each process yields its contiguous slice of every
    group. The last, incomplete group is dropped with ``drop_last``, otherwise completed with
    samples from the first group, so every process yields a whole number of batches.

    Args:
        dataset: the iterable dataset to shard (every process iterates all of it).
        batch_size: per-process batch size, or the whole batch size with ``split_batches``.
        drop_last: drop the last incomplete group instead of completing it.
        num_processes: number of processes.
        process_index: this process's index.
        split_batches: ``batch_size`` is the size of the batch all processes share.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int = 1,
        drop_last: bool = False,
        num_processes: int = 1,
        process_index: int = 0,
        split_batches: bool = False,
    ) -> None:
        if split_batches and batch_size % num_processes:
            raise ValueError(
                f"split_batches needs a batch size ({batch_size}) that is a round multiple of the "
                f"number of processes ({num_processes})"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.epoch = 0

    @property
    def real_batch_size(self) -> int:
        """Samples read per group (all processes together)."""
        return self.batch_size if self.split_batches else self.batch_size * self.num_processes

    @property
    def process_batch_size(self) -> int:
        """Samples this process yields per group."""
        return self.batch_size // self.num_processes if self.split_batches else self.batch_size

    @property
    def total_length(self) -> int:
        """Length of the wrapped dataset (raises ``TypeError`` when it has none)."""
        return len(self.dataset)

    def set_epoch(self, epoch: int) -> None:
        """Record the epoch and pass it on to the dataset when it takes one."""
        self.epoch = epoch
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        groups = len(self.dataset) / self.real_batch_size
        return (math.floor(groups) if self.drop_last else math.ceil(groups)) * (
            self.process_batch_size
        )

    def __iter__(self) -> Iterator[Any]:
        generator = getattr(self.dataset, "generator", None)
        if not hasattr(self.dataset, "set_epoch") and isinstance(generator, torch.Generator):
            generator.manual_seed(self.epoch)
        real, per = self.real_batch_size, self.process_batch_size
        own = slice(self.process_index * per, (self.process_index + 1) * per)
        first: list[Any] | None = None
        group: list[Any] = []
        for sample in self.dataset:
            group.append(sample)
            if len(group) == real:
                yield from group[own]
                first = group if first is None else first
                group = []
        if self.drop_last or not group:
            return
        filler = first if first is not None else list(group)
        while len(group) < real:
            group = group + filler
        yield from group[own]


class SkipBatchSampler(_WrappingBatchSampler):
    """The batches of ``batch_sampler`` after the first ``skip_batches``.

    Args:
        batch_sampler: the batch sampler to skip into.
        skip_batches: how many batches to skip.
    """

    def __init__(self, batch_sampler: Any, skip_batches: int = 0) -> None:
        super().__init__(batch_sampler)
        self.skip_batches = skip_batches

    def __iter__(self) -> Iterator[list[int]]:
        return itertools.islice(iter(self.batch_sampler), self.skip_batches, None)

    def __len__(self) -> int:
        return max(0, len(self.batch_sampler) - self.skip_batches)
