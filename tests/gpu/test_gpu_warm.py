"""Warm workers on GPUs (skipped without CUDA): the second launch finds the CUDA context and
the NCCL communicator the first one made (the same process group object, CUDA already
initialised when the function starts), a resident model stays on its GPU, and GPU memory
after 20 launches stays within 1 % of what it was after the first."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

import nb_accel
from nb_accel import PartialState, notebook_launcher, resident
from nb_accel.runtime.device_types import cuda_facts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(cuda_facts.cuda_device_count() == 0, reason="needs a CUDA GPU"),
]


@pytest.fixture(autouse=True)
def _no_warm_workers_left() -> Iterator[None]:
    yield
    nb_accel.stop_workers()


def what_the_launch_finds() -> tuple[int, bool, int, str, float, int]:
    """This worker's pid, whether CUDA was up before the function touched it, the default
    group's id, the resident model's device, an all_reduce over NCCL and the GPU memory the
    worker holds."""
    cuda_was_up = torch.cuda.is_initialized()
    state = PartialState()
    model = resident("model", lambda: torch.nn.Linear(1024, 1024).to(state.device))
    value = torch.ones(1, device=state.device)
    dist.all_reduce(value)
    torch.cuda.synchronize()
    return (
        os.getpid(),
        cuda_was_up,
        id(dist.group.WORLD),
        str(next(model.parameters()).device),
        value.item(),
        torch.cuda.memory_allocated(state.device),
    )


def _warm() -> list[tuple[int, bool, int, str, float, int]]:
    count = cuda_facts.cuda_device_count()
    return notebook_launcher(what_the_launch_finds, num_processes=count, reuse_workers=True)


def test_the_second_launch_finds_the_cuda_context_and_the_communicator() -> None:
    first = _warm()
    second = _warm()
    count = len(first)
    assert [r[0] for r in first] == [r[0] for r in second]
    assert [r[1] for r in second] == [True] * count  # CUDA up before the function ran
    assert [r[2] for r in first] == [r[2] for r in second]  # the same process group
    assert [r[3] for r in second] == [f"cuda:{i}" for i in range(count)]
    assert [r[4] for r in second] == [float(count)] * count


def test_gpu_memory_after_20_launches_stays_within_one_percent() -> None:
    first = [r[5] for r in _warm()]
    for _ in range(19):
        last = [r[5] for r in _warm()]
    for before, after in zip(first, last, strict=True):
        assert abs(after - before) <= 0.01 * before
