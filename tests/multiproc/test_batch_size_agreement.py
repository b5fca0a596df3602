"""``find_executable_batch_size`` across ranks: when any rank runs out of memory, every rank
leaves the attempt (those waiting for it in a collective are freed) and all retry with the
same smaller size, so every rank returns the same batch size.

Each attempt moves tensors of ``batch_size`` elements through collectives before and after
its memory check: ranks at different sizes would fail in gloo ("data size doesn't match"),
and a rank left waiting would hang until the test's timeout."""

from __future__ import annotations

import gc
import random

import pytest
import torch
import torch.distributed as dist

from nb_accel import find_executable_batch_size, notebook_launcher

TRIALS = 100
START = 64


def _sizes_from(start: int) -> list[int]:
    sizes = [start]
    while sizes[-1] > 1:
        sizes.append(int(sizes[-1] * 0.9))
    return sizes


def seeded_trials() -> list[int]:
    """The batch size each of :data:`TRIALS` seeded trials agreed on, on this rank: each trial
    gives every rank its own memory limit and its own collectives around the check."""
    rank, world = dist.get_rank(), dist.get_world_size()
    agreed = []
    gc.freeze()  # each attempt collects garbage, as Accelerate's does: only the trials' own
    for trial in range(TRIALS):
        rng = random.Random(trial)
        limits = [rng.randint(40, START) for _ in range(world)]
        before, after = rng.randint(0, 2), rng.randint(0, 2)

        @find_executable_batch_size(starting_batch_size=START)
        def attempt(
            batch_size: int, limits: list[int] = limits, before: int = before, after: int = after
        ) -> int:
            for _ in range(before):
                dist.all_reduce(torch.ones(batch_size))
            if batch_size > limits[rank]:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB")
            for _ in range(after):
                dist.all_reduce(torch.ones(batch_size))
            return batch_size

        agreed.append(attempt())
    gc.unfreeze()
    return agreed


@pytest.mark.timeout(240)
def test_a_hundred_seeded_trials_agree_on_every_rank() -> None:
    results = notebook_launcher(seeded_trials, num_processes=3, cpu=True, timeout=60)
    assert results[0] == results[1] == results[2]
    for trial, size in enumerate(results[0]):
        rng = random.Random(trial)
        smallest_limit = min(rng.randint(40, START) for _ in range(3))
        assert size == next(s for s in _sizes_from(START) if s <= smallest_limit), trial


def own_reductions() -> int:
    """Each rank proposes its own next size: all take the smallest."""
    rank = dist.get_rank()
    state = {"size": START}

    def reduce() -> int:
        state["size"] = state["size"] // 2 - rank
        return state["size"]

    @find_executable_batch_size(starting_batch_size=START, reduce_batch_size_fn=reduce)
    def attempt(batch_size: int) -> int:
        dist.all_reduce(torch.ones(batch_size))
        if rank == 1 and batch_size > 20:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return batch_size

    return attempt()


@pytest.mark.timeout(120)
def test_the_ranks_reductions_are_honoured_and_the_smallest_taken() -> None:
    # 64 -> proposals 32, 31 -> 31; rank 1 still out -> proposals 15, 14 -> 14
    assert notebook_launcher(own_reductions, num_processes=2, cpu=True, timeout=60) == [14, 14]


def never_fits() -> None:
    @find_executable_batch_size(starting_batch_size=4)
    def attempt(batch_size: int) -> None:
        dist.all_reduce(torch.ones(batch_size))
        if dist.get_rank() == 0:
            raise torch.OutOfMemoryError("CUDA out of memory.")

    attempt()


@pytest.mark.timeout(120)
def test_every_rank_stops_at_zero_together() -> None:
    with pytest.raises(RuntimeError, match="ran out of memory at every batch size down to 1"):
        notebook_launcher(never_fits, num_processes=2, cpu=True, timeout=60)


def fails_on_rank_1() -> None:
    @find_executable_batch_size(starting_batch_size=8)
    def attempt(batch_size: int) -> None:
        if dist.get_rank() == 1:
            raise KeyError("label column")
        dist.all_reduce(torch.ones(batch_size))  # rank 0 waits here for rank 1

    attempt()


@pytest.mark.timeout(120)
def test_another_error_is_raised_as_it_is() -> None:
    with pytest.raises(KeyError, match="label column"):
        notebook_launcher(fails_on_rank_1, num_processes=2, cpu=True, timeout=60)
