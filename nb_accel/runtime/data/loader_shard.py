"""``DataLoaderShard``: every process loads its own shard of the data.

Also the state every prepared loader shares (``end_of_dataloader``, ``remainder``, registration
with :class:`~nb_accel.runtime.state.GradientState`) and ``SkipDataLoader``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import BatchSampler, DataLoader

from ..._keywords import parameter_names, refuse_unknown
from ..state import GradientState
from ..tree import send_to_device
from .loader_resume import Replay, close_iteration, open_iteration
from .rng import RNGType, synchronize_rng_states
from .sampling import BatchSamplerShard, IterableDatasetShard, SkipBatchSampler
from .stateful import StatefulChoice, loader_parameters

__all__ = ["DataLoaderStateMixin", "DataLoaderShard", "SkipDataLoader", "shard_sampler_of"]

_END = object()


def shard_sampler_of(batch_sampler: Any) -> tuple[BatchSamplerShard | None, int]:
    """The :class:`BatchSamplerShard` under ``batch_sampler`` (through skips) and the number of
    its batches skipped before it; ``(None, 0)`` when there is none."""
    offset = 0
    while isinstance(batch_sampler, SkipBatchSampler):
        offset += batch_sampler.skip_batches
        batch_sampler = batch_sampler.batch_sampler
    if isinstance(batch_sampler, BatchSamplerShard):
        return batch_sampler, offset
    return None, 0


class _Itself:
    """``loader.base_dataloader``: Accelerate's prepared loaders wrap the loader they read
    from; ours are that loader themselves (a ``DataLoader``, or a ``StatefulDataLoader``)."""

    def __get__(self, loader: Any, owner: type | None = None) -> Any:
        if loader is None:
            raise AttributeError("base_dataloader belongs to a loader, not to its class")
        return loader


class DataLoaderStateMixin:
    """Where a prepared loader's iteration stands, as :class:`GradientState` reads it.

    Attributes:
        end_of_dataloader: True while the last batch of this process is being processed.
        remainder: how many samples of the last total batch are real (not repeats to even
            out the processes); -1 when unknown or when nothing is repeated.
        uneven_ranks: the processes holding a batch at the current step when their batches
            differ in size or some have none (``even_batches=False``); ``None`` otherwise.
        gather_ranks: the processes taking part in this step's uneven gather: those holding a
            batch, and those that ran out at the step before (they wait in their last gather).
        tail_follows: some processes hold no batch at the next step.
        trailing_ranks: at this process's last batch, when others still hold one at the next
            step: those processes (this one then takes part in their gather as well).
        total_batch_size: samples per step over all processes.
        total_dataset_length: length of the whole dataset (all processes together).
    """

    #: Returned from a launched function it is refused (see ``worker/process/returns.py``).
    _nb_accel_worker_only = (
        "return the data or what you computed from it; a loader prepared in the kernel's "
        "next launch shards the data again"
    )

    end_of_dataloader: bool = False
    remainder: int = -1
    base_dataloader = _Itself()
    uneven_ranks: tuple[int, ...] | None = None
    gather_ranks: tuple[int, ...] | None = None
    tail_follows: bool = False
    trailing_ranks: tuple[int, ...] | None = None
    gradient_state: GradientState
    _drop_last: bool
    iteration: int = 0  # completed epochs (iterations)
    _in_epoch: bool = False  # between the start and the end of an iteration
    _batches_seen: int = 0  # batches yielded in the current (or last) iteration
    _epoch_start: dict[str, Any] | None = None  # generator states at the iteration's start
    _abandoned: bool = False  # the last iteration was left part-way (a break)
    _opened: int = -1  # when the last iteration started (a process-wide count)
    if TYPE_CHECKING:  # each loader class defines them

        @property
        def total_batch_size(self) -> int:
            """Samples per step over all processes."""

        @property
        def total_dataset_length(self) -> int:
            """Length of the whole dataset."""

    #: The arguments of the loader's class beyond ``DataLoader``'s that a copy of it keeps
    #: (``skip_first_batches``), read from the attributes of the same names.
    _own_arguments: tuple[str, ...] = ()

    def _own_settings(self) -> dict[str, Any]:
        """The values of :attr:`_own_arguments` this loader has."""
        return {name: getattr(self, name) for name in self._own_arguments}

    def _note_position(self) -> None:
        """The batch about to be handed out was read (stateful loaders remember the spot)."""

    def _handed_out(self, last: bool) -> None:
        """A dispatcher handed out a step, the ``last`` one of the iteration or not."""

    def reset(self) -> None:
        """Clear the state of the previous iteration."""
        self.end_of_dataloader = False
        self.remainder = -1
        self.set_holders(None, None, True, 1, 0)

    def set_holders(
        self,
        holders: tuple[int, ...] | None,
        following: tuple[int, ...] | None,
        first: bool,
        parts: int,
        me: int,
    ) -> None:
        """Record who holds a batch at this step (``holders``) and at the next (``following``),
        ``None`` meaning every process a batch of the same size (or no next step)."""
        self.uneven_ranks = holders
        short = holders is not None and len(holders) < parts
        self.gather_ranks = tuple(range(parts)) if short and not first else holders
        self.tail_follows = following is not None and len(following) < parts
        self.trailing_ranks = None
        if following is not None and self.tail_follows and me not in following:
            self.trailing_ranks = following

    def _sample_count(self) -> int:
        return int(self.total_dataset_length)

    def begin(self) -> None:
        """Start an iteration: reset the state and register with the gradient state."""
        self.reset()
        if not self._drop_last:
            try:
                self.remainder = self._sample_count() % int(self.total_batch_size)
            except (TypeError, ValueError, AttributeError, ZeroDivisionError):
                self.remainder = -1
        self.gradient_state._add_dataloader(self)

    def end(self) -> None:
        """Finish (or abandon) an iteration: unregister from the gradient state."""
        self.gradient_state._remove_dataloader(self)

    def finish_iteration(self, replay: Replay | None, completed: bool) -> None:
        """Wrap up an iteration that ``completed`` or was abandoned: restore the generators a
        replayed start borrowed, unregister, count the epoch, record where it stopped."""
        if replay is not None:
            replay.finish()
        self.end()
        if completed:
            self.iteration += 1
        close_iteration(self, completed)


def _set_epoch_on(loader: DataLoader, epoch: int) -> None:  # type: ignore[type-arg]
    batch_sampler = loader.batch_sampler
    if batch_sampler is None and isinstance(loader.sampler, BatchSampler):
        batch_sampler = loader.sampler
    set_batch_sampler_epoch = getattr(batch_sampler, "set_epoch", None)
    if set_batch_sampler_epoch is not None:  # a custom batch sampler's own (or through a shard)
        set_batch_sampler_epoch(epoch)
    set_sampler_epoch = getattr(getattr(batch_sampler, "sampler", None), "set_epoch", None)
    if set_sampler_epoch is not None:
        set_sampler_epoch(epoch)
    elif hasattr(loader.dataset, "set_epoch"):
        loader.dataset.set_epoch(epoch)


class DataLoaderShard(StatefulChoice, DataLoaderStateMixin, DataLoader):  # type: ignore[type-arg]
    """A ``DataLoader`` over this process's shard that keeps processes in step.

    At the start of every iteration it synchronises the random number generators named in
    ``rng_types`` with process 0 (so shuffling agrees), moves each batch to ``device``, keeps
    ``end_of_dataloader`` / ``remainder`` up to date and registers with the gradient state
    while it is iterated (until the iteration ends or is abandoned).

    Args:
        dataset: the dataset (usually already sharded by its sampler or wrapper).
        device: put every batch on this device (``None``: leave it where it is).
        rng_types: generators to synchronise at every new iteration: ``"torch"``,
            ``"cuda"``, ``"generator"`` (``synchronized_generator``).
        synchronized_generator: the generator the sampler shuffles with.
        skip_batches: batches to skip at the start of every iteration.
        use_stateful_dataloader: build the loader on torchdata's ``StatefulDataLoader``, with
            ``state_dict()`` and ``load_state_dict()`` (see :mod:`.stateful`).
        torch_device_mesh: accepted and unused, as in Accelerate (whose shards do not read it).
        iteration: the epoch the first iteration is (``set_epoch`` is called with it, and it
            counts up with every completed iteration), as in Accelerate.
        kwargs: every other ``DataLoader`` argument (``StatefulDataLoader``'s with
            ``use_stateful_dataloader``); any other name raises ``TypeError``.
    """

    _own_arguments = (
        "device",
        "rng_types",
        "synchronized_generator",
        "_drop_last",
        "_non_blocking",
    )

    def __init__(
        self,
        dataset: Any,
        device: torch.device | None = None,
        rng_types: Sequence[RNGType | str] | None = None,
        synchronized_generator: torch.Generator | None = None,
        skip_batches: int = 0,
        use_stateful_dataloader: bool = False,
        _drop_last: bool = False,
        _non_blocking: bool = False,
        torch_device_mesh: Any = None,
        iteration: int = 0,
        **kwargs: Any,
    ) -> None:
        refuse_unknown(
            "DataLoaderShard", kwargs, [*parameter_names(DataLoaderShard), *loader_parameters(self)]
        )
        del torch_device_mesh  # Accelerate's shards leave it unused too
        super().__init__(dataset, **kwargs)
        self.device = device
        self.rng_types = [RNGType(kind).value for kind in rng_types] if rng_types else None
        self.synchronized_generator = synchronized_generator
        self.skip_batches = skip_batches
        self._drop_last = _drop_last
        self._non_blocking = _non_blocking
        self.gradient_state = GradientState()
        self.iteration = int(iteration)
        self.reset()

    def _batch_sampler(self) -> Any:
        if self.batch_sampler is None and isinstance(self.sampler, BatchSampler):
            return self.sampler
        return self.batch_sampler

    @property
    def even_batches(self) -> bool:
        """False when the shards may hold different numbers or sizes of batches."""
        shard, _ = shard_sampler_of(self._batch_sampler())
        return shard is None or shard.even_batches

    @property
    def total_batch_size(self) -> int:
        """Samples per step over all processes."""
        if isinstance(self.dataset, IterableDatasetShard):
            return self.dataset.real_batch_size
        batch_sampler = self._batch_sampler()
        size = getattr(batch_sampler, "batch_size", None) or self.batch_size
        if size is None:
            raise TypeError("this loader's batches vary in size: it has no total batch size")
        shard, _ = shard_sampler_of(batch_sampler)
        if shard is None or shard.split_batches:
            return int(size)
        return int(size) * shard.num_processes

    @property
    def total_dataset_length(self) -> int:
        """Length of the whole dataset (all processes together)."""
        return int(getattr(self.dataset, "total_length", None) or len(self.dataset))  # type: ignore[arg-type]

    def _sample_count(self) -> int:
        shard, _ = shard_sampler_of(self._batch_sampler())
        sampler = getattr(shard, "sampler", None) if shard is not None else None
        try:
            return len(sampler)  # type: ignore[arg-type]
        except TypeError:
            return self.total_dataset_length

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` from now on; passed on to the sampler (or dataset) when it takes one."""
        self.iteration = epoch
        _set_epoch_on(self, epoch)

    def __len__(self) -> int:
        return max(0, super().__len__() - self.skip_batches)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        replay = open_iteration(self)
        if self.rng_types:
            synchronize_rng_states(self.rng_types, self.synchronized_generator)
        self.begin()
        self.set_epoch(self.iteration)
        completed = False
        try:
            yield from self._batches(replay)
            completed = True
        finally:
            self.finish_iteration(replay, completed)

    def _batches(self, replay: Replay | None) -> Iterator[Any]:
        shard, offset = shard_sampler_of(self._batch_sampler())
        iterator = super().__iter__()
        current = next(iterator, _END)
        if replay is not None:
            replay.finish()  # the epoch's start is replayed: shuffled as it was
        index = 0
        while current is not _END:
            if self.device is not None:
                current = send_to_device(current, self.device, non_blocking=self._non_blocking)
            self._note_position()
            upcoming = next(iterator, _END)
            if upcoming is _END:
                self._note_position()  # the iteration is over: resuming starts the next one
            self.end_of_dataloader = upcoming is _END
            if shard is not None:
                step, first = index + offset, index <= self.skip_batches
                holders, following = shard.uneven_ranks_at(step), shard.uneven_ranks_at(step + 1)
                self.set_holders(
                    holders, following, first, shard.num_processes, shard.process_index
                )
            if index >= self.skip_batches:
                self._batches_seen += 1
                yield current
            index += 1
            current = upcoming
        self.end_of_dataloader = True


class SkipDataLoader(StatefulChoice, DataLoader):  # type: ignore[type-arg]
    """A ``DataLoader`` that skips the first ``skip_batches`` batches of every iteration.

    Args:
        dataset: the dataset.
        skip_batches: how many batches to skip.
        use_stateful_dataloader: build the loader on torchdata's ``StatefulDataLoader``.
        kwargs: every other ``DataLoader`` argument; any other name raises ``TypeError``.
    """

    def __init__(
        self,
        dataset: Any,
        skip_batches: int = 0,
        use_stateful_dataloader: bool = False,
        **kwargs: Any,
    ) -> None:
        refuse_unknown(
            "SkipDataLoader", kwargs, [*parameter_names(SkipDataLoader), *loader_parameters(self)]
        )
        super().__init__(dataset, **kwargs)
        self.skip_batches = skip_batches

    base_dataloader = _Itself()

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        return itertools.islice(super().__iter__(), self.skip_batches, None)

    def __len__(self) -> int:
        return max(0, super().__len__() - self.skip_batches)
