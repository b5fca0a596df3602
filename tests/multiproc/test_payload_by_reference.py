"""Forked workers inherit the launched call with the kernel's memory: nothing of it is pickled,
a big global or argument is not copied into each rank, and objects that cannot be pickled work
too. Workers that do not inherit the kernel's memory (spawn, forkserver) get it pickled, and
return the same results."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from nb_accel import notebook_launcher

sys.path.insert(0, str(Path(__file__).parent))
from test_multinode import _two_nodes

sys.path.remove(str(Path(__file__).parent))

#: How many times a :class:`Counted` was pickled in this process.
PICKLED: list[int] = []


class Counted:
    """An argument that counts its pickles (in the process that pickles it: the kernel)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __reduce__(self) -> Any:
        PICKLED.append(self.value)
        return (Counted, (self.value,))


def read_value(counted: Counted, *, extra: Counted) -> int:
    return counted.value + extra.value


@pytest.mark.parametrize(
    ("start_method", "pickles"), [("fork", 0), ("spawn", 2), ("forkserver", 2)]
)
def test_under_fork_nothing_of_the_call_is_pickled(start_method: str, pickles: int) -> None:
    PICKLED.clear()
    results = notebook_launcher(
        read_value,
        args=(Counted(40),),
        kwargs={"extra": Counted(2)},
        num_processes=2,
        start_method=start_method,
    )
    assert results == [42, 42]
    assert len(PICKLED) == pickles  # spawn and forkserver: each argument once, for all ranks


def use_the_lock_and_the_generator(lock: Any, numbers: Any) -> int:
    with lock:
        return next(numbers)  # each rank's own copy of the kernel's generator


def test_objects_that_cannot_be_pickled_work_under_fork() -> None:
    numbers = (n * 10 for n in range(1, 4))
    results = notebook_launcher(
        use_the_lock_and_the_generator, args=(threading.Lock(), numbers), num_processes=2
    )
    assert results == [10, 10]
    assert next(numbers) == 10  # the kernel's own generator has not moved


@pytest.mark.timeout(200)
def test_objects_that_cannot_be_pickled_work_on_every_node(tmp_path: Path) -> None:
    """Each node's kernel forks its workers (through torch's elastic agent) from its memory."""
    node0, node1 = _two_nodes(tmp_path, "unpicklable", "num_nodes=2")
    assert node0.get("results") == [{"rank": 0, "next": 7}, {"rank": 1, "next": 7}], node0
    assert node1.get("results") == [{"rank": 2, "next": 7}, {"rank": 3, "next": 7}], node1


#: A tensor of the kernel's that the launched function reaches as a global (200 MB, made by
#: the test that uses it).
BIG = torch.empty(0)


def sum_the_global() -> tuple[float, float]:
    """The global's sum, and this rank's private memory (MB) after reading all of it."""
    total = float(BIG.sum())
    private = psutil.Process().memory_full_info().uss / 2**20
    return total, private


def sum_the_argument(big: torch.Tensor) -> tuple[float, float]:
    """The argument's sum, and this rank's private memory (MB) after reading all of it."""
    total = float(big.sum())
    private = psutil.Process().memory_full_info().uss / 2**20
    return total, private


@pytest.fixture
def big_global() -> Iterator[torch.Tensor]:
    """:data:`BIG` filled for the test, emptied after it."""
    global BIG  # noqa: PLW0603 - the launched function reaches it as a global
    BIG = torch.ones(50_000_000)
    yield BIG
    BIG = torch.empty(0)


@pytest.mark.timeout(300)
def test_a_big_global_or_argument_is_shared_by_forked_ranks_not_copied(
    big_global: torch.Tensor,
) -> None:
    size_mb = big_global.numel() * big_global.element_size() / 2**20
    for results in (
        notebook_launcher(sum_the_global, num_processes=2),
        notebook_launcher(sum_the_argument, args=(big_global,), num_processes=2),
    ):
        for total, private_mb in results:
            assert total == big_global.numel()
            assert private_mb < size_mb / 4, f"{private_mb:.0f} MB private, {size_mb:.0f} MB read"
