"""Per-rank sharding in one process: batch samplers, iterable datasets, skipping, seeded order."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, TensorDataset

from nb_accel.runtime.data.loader_shard import DataLoaderShard, SkipDataLoader
from nb_accel.runtime.data.loaders import prepare_data_loader, skip_first_batches
from nb_accel.runtime.data.sampling import (
    BatchSamplerShard,
    IterableDatasetShard,
    SeedableRandomSampler,
    SkipBatchSampler,
)
from nb_accel.runtime.state import GradientState


def shards(
    n: int, bs: int, drop_last: bool, split: bool = False, even: bool = True, procs: int = 2
) -> list[list[list[int]]]:
    sampler = BatchSampler(range(n), bs, drop_last)
    return [list(BatchSamplerShard(sampler, procs, rank, split, even)) for rank in range(procs)]


# The worked examples of DESIGN.md section 4 (2 processes).
WORKED = [
    (
        (24, 3, False, False, True),
        [[0, 1, 2], [6, 7, 8], [12, 13, 14], [18, 19, 20]],
        [[3, 4, 5], [9, 10, 11], [15, 16, 17], [21, 22, 23]],
    ),
    (
        (21, 3, False, False, True),
        [[0, 1, 2], [6, 7, 8], [12, 13, 14], [18, 19, 20]],
        [[3, 4, 5], [9, 10, 11], [15, 16, 17], [0, 1, 2]],
    ),
    (
        (21, 3, True, False, True),
        [[0, 1, 2], [6, 7, 8], [12, 13, 14]],
        [[3, 4, 5], [9, 10, 11], [15, 16, 17]],
    ),
    (
        (22, 3, False, False, True),
        [[0, 1, 2], [6, 7, 8], [12, 13, 14], [18, 19, 20]],
        [[3, 4, 5], [9, 10, 11], [15, 16, 17], [21, 0, 1]],
    ),
    (
        (24, 4, False, True, True),
        [[0, 1], [4, 5], [8, 9], [12, 13], [16, 17], [20, 21]],
        [[2, 3], [6, 7], [10, 11], [14, 15], [18, 19], [22, 23]],
    ),
    (
        (21, 3, False, False, False),
        [[0, 1, 2], [6, 7, 8], [12, 13, 14], [18, 19, 20]],
        [[3, 4, 5], [9, 10, 11], [15, 16, 17]],
    ),
]


@pytest.mark.parametrize(("case", "rank0", "rank1"), WORKED, ids=str)
def test_worked_examples(case: tuple[int, int, bool, bool, bool], rank0: list, rank1: list) -> None:
    n, bs, drop_last, split, even = case
    got = shards(n, bs, drop_last, split, even)
    assert got == [rank0, rank1]
    assert [
        len(BatchSamplerShard(BatchSampler(range(n), bs, drop_last), 2, r, split, even))
        for r in range(2)
    ] == [len(rank0), len(rank1)]


def test_three_processes_complete_the_last_round_from_the_start() -> None:
    assert shards(22, 3, False, procs=3) == [
        [[0, 1, 2], [9, 10, 11], [18, 19, 20]],
        [[3, 4, 5], [12, 13, 14], [21, 0, 1]],
        [[6, 7, 8], [15, 16, 17], [2, 3, 4]],
    ]
    assert shards(22, 3, False, even=False, procs=3) == [
        [[0, 1, 2], [9, 10, 11], [18, 19, 20]],
        [[3, 4, 5], [12, 13, 14], [21]],
        [[6, 7, 8], [15, 16, 17]],
    ]


def test_fewer_samples_than_processes_still_gives_everyone_a_batch() -> None:
    assert shards(2, 3, False) == [[[0, 1, 0]], [[1, 0, 1]]]
    assert shards(1, 4, False, split=True) == [[[0, 0]], [[0, 0]]]
    assert shards(2, 3, False, even=False) == [[[0, 1]], []]


COMBOS = list(itertools.product(range(1, 30), (1, 2, 3, 4), (False, True), (2, 3)))


@pytest.mark.parametrize("even", [True, False])
@pytest.mark.parametrize("split", [False, True])
def test_lengths_and_coverage_over_many_sizes(split: bool, even: bool) -> None:
    for n, bs, drop_last, procs in COMBOS:
        if split and bs % procs:
            continue
        sampler = BatchSampler(range(n), bs, drop_last)
        per_rank = [list(BatchSamplerShard(sampler, procs, r, split, even)) for r in range(procs)]
        lengths = [len(BatchSamplerShard(sampler, procs, r, split, even)) for r in range(procs)]
        label = (n, bs, drop_last, procs, split, even)
        assert [len(batches) for batches in per_rank] == lengths, label
        seen = [i for batches in per_rank for batch in batches for i in batch]
        if even:
            assert len(set(lengths)) == 1, label
            size = bs // procs if split else bs
            assert all(len(b) == size for batches in per_rank for b in batches), label
        if not even:
            assert sorted(seen) == sorted(set(seen)), f"repeats without even_batches: {label}"
        if not drop_last:
            assert set(seen) == set(range(n)), label


def test_even_batches_repeat_only_the_start_and_only_at_the_end() -> None:
    for n, procs in itertools.product(range(1, 40), (2, 3)):
        per_rank = shards(n, 4, False, procs=procs)
        # Round-robin order: process 0's batch, process 1's, ... as gather would see them.
        order = [i for rnd in zip(*per_rank, strict=True) for batch in rnd for i in batch]
        assert order[:n] == list(range(n))
        assert all(i < 4 * procs for i in order[n:])


class VaryingBatches:
    """A batch sampler with no batch_size whose batches differ in size."""

    sizes = (1, 3, 2, 5, 4, 2, 1)

    def __iter__(self) -> Iterator[list[int]]:
        start = 0
        for size in self.sizes:
            yield list(range(start, start + size))
            start += size

    def __len__(self) -> int:
        return len(self.sizes)


class ListedBatches:
    """A batch sampler of the given batches, with no batch_size (sizes vary)."""

    def __init__(self, batches: list[list[int]]) -> None:
        self.batches = batches

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def test_varying_batch_sizes_are_completed_with_whole_batches_from_the_start() -> None:
    batches = ListedBatches([[0, 1, 2], [3, 4], [5, 6, 7, 8], [9, 10, 11], [12, 13]])
    per_rank = [list(BatchSamplerShard(batches, 2, r)) for r in (0, 1)]
    assert per_rank[0] == [[0, 1, 2], [5, 6, 7, 8], [12, 13]]
    assert per_rank[1] == [[3, 4], [9, 10, 11], [0, 1, 2]]
    assert [len(BatchSamplerShard(batches, 2, r)) for r in (0, 1)] == [3, 3]
    # Fewer batches than processes: every process still gets one, cycling from the start.
    few = [list(BatchSamplerShard(ListedBatches([[0], [1, 2]]), 3, r)) for r in range(3)]
    assert few == [[[0]], [[1, 2]], [[0]]]
    even = [list(BatchSamplerShard(ListedBatches(batches.batches[:4]), 2, r)) for r in (0, 1)]
    assert even == [[[0, 1, 2], [5, 6, 7, 8]], [[3, 4], [9, 10, 11]]]  # nothing to complete
    loader = DataLoader(range(14), batch_sampler=batches)
    prepared = [prepare_data_loader(loader, num_processes=2, process_index=r) for r in (0, 1)]
    assert [[b.tolist() for b in p] for p in prepared] == per_rank


def test_varying_batch_sizes_cannot_be_split() -> None:
    with pytest.raises(ValueError, match="split_batches=False"):
        BatchSamplerShard(VaryingBatches(), 2, 0, split_batches=True, even_batches=False)
    per_rank = [list(BatchSamplerShard(VaryingBatches(), 2, r, even_batches=False)) for r in (0, 1)]
    batches = list(VaryingBatches())
    assert per_rank == [batches[0::2], batches[1::2]]
    assert [len(BatchSamplerShard(VaryingBatches(), 2, r, even_batches=False)) for r in (0, 1)] == [
        4,
        3,
    ]
    steps = [
        BatchSamplerShard(VaryingBatches(), 2, 0, even_batches=False).uneven_ranks_at(s)
        for s in range(4)
    ]
    assert steps == [(0, 1), (0, 1), (0, 1), (0,)]


@pytest.mark.parametrize("split", [False, True])
def test_uneven_ranks_match_who_holds_a_batch(split: bool) -> None:
    for n, procs in itertools.product(range(1, 50), (2, 3)):
        sampler = BatchSampler(range(n), 6, False)
        per_rank = [list(BatchSamplerShard(sampler, procs, r, split, False)) for r in range(procs)]
        shard = BatchSamplerShard(sampler, procs, 0, split, False)
        for step in range(max(len(b) for b in per_rank)):
            holders = [r for r in range(procs) if len(per_rank[r]) > step]
            sizes = {len(per_rank[r][step]) for r in holders}
            expected = None if len(holders) == procs and len(sizes) == 1 else tuple(holders)
            assert shard.uneven_ranks_at(step) == expected, (n, procs, step)


def test_split_batches_needs_a_multiple_of_the_process_count() -> None:
    with pytest.raises(ValueError, match="multiple"):
        BatchSamplerShard(BatchSampler(range(10), 3, False), 2, 0, split_batches=True)
    with pytest.raises(ValueError, match="process_index"):
        BatchSamplerShard(BatchSampler(range(10), 3, False), 2, 2)


class Stream(IterableDataset):  # type: ignore[type-arg]
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n))

    def __len__(self) -> int:
        return self.n


def iterable_shards(n: int, bs: int, drop_last: bool, split: bool, procs: int = 2) -> list:
    return [
        list(IterableDatasetShard(Stream(n), bs, drop_last, procs, r, split)) for r in range(procs)
    ]


def test_iterable_shards_as_documented() -> None:
    assert iterable_shards(8, 4, False, False) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert iterable_shards(8, 4, False, True) == [[0, 1, 4, 5], [2, 3, 6, 7]]


def test_iterable_shards_complete_or_drop_the_last_group() -> None:
    assert iterable_shards(10, 3, False, False) == [[0, 1, 2, 6, 7, 8], [3, 4, 5, 9, 0, 1]]
    assert iterable_shards(10, 3, True, False) == [[0, 1, 2], [3, 4, 5]]
    assert iterable_shards(10, 4, False, True) == [[0, 1, 4, 5, 8, 9], [2, 3, 6, 7, 0, 1]]
    assert iterable_shards(10, 4, True, True) == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert iterable_shards(2, 3, False, False, procs=3) == [[0, 1, 0], [1, 0, 1], [0, 1, 0]]


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_iterable_shard_lengths(split: bool, drop_last: bool) -> None:
    for n, bs, procs in itertools.product(range(1, 30), (2, 4, 6), (2, 3)):
        if split and bs % procs:
            continue
        for r in range(procs):
            shard = IterableDatasetShard(Stream(n), bs, drop_last, procs, r, split)
            assert len(shard) == len(list(shard)), (n, bs, procs, r)


def test_iterable_shard_split_needs_a_multiple_of_the_process_count() -> None:
    # A batch of 1 cannot be split in 2: one process would get every sample, the other none.
    with pytest.raises(ValueError, match="multiple"):
        IterableDatasetShard(Stream(5), 1, False, 2, 0, split_batches=True)
    assert list(IterableDatasetShard(Stream(3), 1, False, 1, 0, split_batches=True)) == [0, 1, 2]


def test_iterable_shard_passes_the_epoch_on() -> None:
    class Epochs(Stream):
        epoch = -1

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

    dataset = Epochs(4)
    IterableDatasetShard(dataset, 2, num_processes=2).set_epoch(7)
    assert dataset.epoch == 7


def test_skip_first_batches_of_a_plain_loader() -> None:
    skipped = skip_first_batches(DataLoader(range(16), batch_size=4), 2)
    assert [b.tolist() for b in skipped] == [[8, 9, 10, 11], [12, 13, 14, 15]]
    assert len(skipped) == 2
    iterable = skip_first_batches(DataLoader(Stream(16), batch_size=4), 3)
    assert isinstance(iterable, SkipDataLoader)
    assert [b.tolist() for b in iterable] == [[12, 13, 14, 15]]


def test_skip_batch_sampler_counts_and_skips() -> None:
    sampler = SkipBatchSampler(BatchSampler(range(10), 3, False), 2)
    assert list(sampler) == [[6, 7, 8], [9]]
    assert len(sampler) == 2 and sampler.total_length == 4


def test_skip_first_batches_keeps_a_shard_and_its_settings() -> None:
    dataset = TensorDataset(torch.arange(40))
    loader = prepare_data_loader(
        DataLoader(dataset, batch_size=4, collate_fn=lambda rows: [r[0] * 10 for r in rows]),
        num_processes=2,
        process_index=1,
    )
    skipped = skip_first_batches(loader, 3)
    assert isinstance(skipped, DataLoaderShard)
    assert [[int(v) for v in b] for b in skipped] == [[280, 290, 300, 310], [360, 370, 380, 390]]
    assert len(skipped) == 2


def test_seedable_sampler_same_seed_same_order_on_every_rank() -> None:
    data = range(50)
    ranks = [SeedableRandomSampler(data, data_seed=123) for _ in range(2)]
    torch.manual_seed(1)  # the global generator must not matter
    first = list(ranks[0])
    torch.manual_seed(2)
    assert list(ranks[1]) == first
    assert sorted(first) == list(range(50)) and first != list(range(50))
    assert list(SeedableRandomSampler(data, data_seed=124)) != first


def test_seedable_sampler_epochs_change_and_replay_the_order() -> None:
    sampler = SeedableRandomSampler(range(50), data_seed=5)
    epoch0 = list(sampler)
    assert sampler.epoch == 1  # a finished pass moves to the next epoch
    epoch1 = list(sampler)
    assert epoch1 != epoch0
    sampler.set_epoch(0)
    assert list(sampler) == epoch0
    other = SeedableRandomSampler(range(50), data_seed=5)
    other.set_epoch(1)
    assert list(other) == epoch1


def test_shuffled_order_follows_the_global_seed() -> None:
    def order(seed: int) -> list[list[int]]:
        torch.manual_seed(seed)
        loader = DataLoader(range(20), batch_size=2, shuffle=True)
        return [b.tolist() for b in prepare_data_loader(loader, num_processes=2, process_index=0)]

    assert order(1) == order(1)
    assert order(1) != order(2)  # as with a plain DataLoader, the seed sets the order


def test_prepared_loader_keeps_the_user_arguments() -> None:
    def collate(rows: list) -> list:
        return [int(r[0]) for r in rows]

    def init(worker: int) -> None:
        pass

    generator = torch.Generator().manual_seed(3)
    loader = DataLoader(
        TensorDataset(torch.arange(10)),
        batch_size=2,
        collate_fn=collate,
        worker_init_fn=init,
        generator=generator,
        timeout=5,
        num_workers=1,
        prefetch_factor=3,
        persistent_workers=True,
    )
    prepared = prepare_data_loader(loader, num_processes=2, process_index=0)
    assert isinstance(prepared, DataLoaderShard)
    assert prepared.collate_fn is collate and prepared.worker_init_fn is init
    assert prepared.generator is generator and prepared.timeout == 5
    assert prepared.num_workers == 1 and prepared.prefetch_factor == 3
    assert prepared.persistent_workers
    assert isinstance(prepared.batch_sampler, BatchSamplerShard)
    assert prepared.total_batch_size == 4 and prepared.total_dataset_length == 10


def test_loader_state_on_one_process() -> None:
    loader = prepare_data_loader(DataLoader(TensorDataset(torch.arange(10)), batch_size=4))
    state = GradientState()
    seen = []
    for (batch,) in loader:
        seen.append(
            (
                batch.tolist(),
                loader.end_of_dataloader,
                loader.remainder,
                state.end_of_dataloader,
                state.active_dataloader is loader,
            )
        )
    assert seen == [
        ([0, 1, 2, 3], False, 2, False, True),
        ([4, 5, 6, 7], False, 2, False, True),
        ([8, 9], True, 2, True, True),
    ]
    assert state.active_dataloader is None
    for _ in loader:
        break  # abandoned early: still unregistered
    assert state.active_dataloader is None and not state.in_dataloader


class EpochBatchSampler:
    """A custom batch sampler (not a ``BatchSampler``) whose order depends on its epoch."""

    def __init__(self, n: int, size: int) -> None:
        self.n, self.batch_size, self.drop_last = n, size, False
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.epoch))
        for start in range(0, self.n, self.batch_size):
            yield order[start : start + self.batch_size].tolist()

    def __len__(self) -> int:
        return -(-self.n // self.batch_size)


@pytest.mark.parametrize("procs", [1, 2])
def test_set_epoch_reaches_a_custom_batch_sampler(procs: int) -> None:
    batch_sampler = EpochBatchSampler(8, 2)
    loader = DataLoader(TensorDataset(torch.arange(8)), batch_sampler=batch_sampler)
    prepared = prepare_data_loader(loader, num_processes=procs, process_index=0)
    prepared.set_epoch(5)
    assert batch_sampler.epoch == 5
    first = [batch.tolist() for (batch,) in prepared]
    prepared.set_epoch(6)
    assert batch_sampler.epoch == 6
    assert [batch.tolist() for (batch,) in prepared] != first
