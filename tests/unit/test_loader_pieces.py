"""The dispatcher's piecewise loading gives every process exactly what collating a whole step and
cutting it gives, for the sample structures it handles, and steps aside for the others."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data._utils.collate import default_collate

from nb_accel.runtime.data.loader_pieces import Stacked, pieces_supported, prepared_steps
from nb_accel.runtime.data.wire import Prepared, Preparer, layout, pack_into, unpack
from nb_accel.runtime.tree import flatten_tree, slice_tensors

PARTS, PER = 2, 3
FULL = PARTS * PER
BOUNDS = [(0, PER), (PER, FULL)]


class Samples(Dataset):  # type: ignore[type-arg]
    """A map-style dataset of ``count`` samples built by ``make(index)``."""

    def __init__(self, count: int, make: Any) -> None:
        self.count, self.make = count, make

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> Any:
        return self.make(index)


def _image(i: int) -> torch.Tensor:
    return torch.arange(12, dtype=torch.float32).reshape(3, 2, 2) + 100 * i


class Pair(NamedTuple):
    image: torch.Tensor
    label: int


STRUCTURES = {
    "named": lambda i: Pair(_image(i), i),
    "tensor": _image,
    "tuple": lambda i: (_image(i), i),
    "dict": lambda i: {"x": _image(i), "y": float(i) / 3, "mask": i % 2 == 0},
    "nested": lambda i: [{"a": torch.tensor([i, -i])}, (np.float32(i), np.arange(3) * i)],
}


def _cut(preparer: Preparer, batch: Any, first: Any) -> Prepared:
    """The ordinary way, for the test: every piece cut out of the whole step."""
    del first
    pieces = [slice_tensors(batch, slice(a, b)) for a, b in BOUNDS]
    return preparer.prepare(FULL, pieces[0], [layout(piece) for piece in pieces])


def _received(step: Prepared, rank: int) -> Any:
    """What process ``rank`` would unpack from the message of ``step``."""
    if rank == 0:
        return step.own
    buffer = torch.zeros(step.data_size + 64, dtype=torch.uint8)
    pack_into(buffer, step.specs[rank], step.tensors[rank], 16)
    return unpack(step.specs[rank], buffer, 16)


def _same(a: Any, b: Any) -> bool:
    leaves_a, tree_a = flatten_tree(a)
    leaves_b, tree_b = flatten_tree(b)
    if tree_a != tree_b or len(leaves_a) != len(leaves_b):
        return False
    for x, y in zip(leaves_a, leaves_b, strict=True):
        if isinstance(x, torch.Tensor):
            if not (isinstance(y, torch.Tensor) and x.dtype == y.dtype and torch.equal(x, y)):
                return False
        elif x != y:
            return False
    return True


def _steps(dataset: Dataset, skip: int = 0) -> list[Prepared]:  # type: ignore[type-arg]
    loader = DataLoader(dataset, batch_size=FULL)
    assert pieces_supported(loader)
    return list(prepared_steps(loader, Preparer(), BOUNDS, skip, None, _cut))


@pytest.mark.parametrize("structure", sorted(STRUCTURES))
def test_pieces_equal_the_cut_of_the_whole_step(structure: str) -> None:
    make = STRUCTURES[structure]
    dataset = Samples(3 * FULL, make)
    steps = _steps(dataset)  # the first step settles the structure, the others reuse it
    assert len(steps) == 3
    for number, step in enumerate(steps):
        whole = default_collate([make(i) for i in range(number * FULL, (number + 1) * FULL)])
        assert step.rows == FULL
        for rank, (start, stop) in enumerate(BOUNDS):
            assert _same(_received(step, rank), slice_tensors(whole, slice(start, stop)))
        assert any(isinstance(t, Stacked) for t in step.tensors[1])  # built straight in place


def test_skipped_steps_are_not_loaded() -> None:
    loaded: list[int] = []

    def make(i: int) -> torch.Tensor:
        loaded.append(i)
        return _image(i)

    steps = _steps(Samples(3 * FULL, make), skip=2)
    assert len(steps) == 1 and loaded == list(range(2 * FULL, 3 * FULL))


def test_a_short_last_step_and_strings_go_the_ordinary_way() -> None:
    cut: list[int] = []

    def counting_cut(preparer: Preparer, batch: Any, first: Any) -> Prepared:
        cut.append(len(batch[0]))
        return _cut(preparer, batch, first)

    loader = DataLoader(Samples(FULL + 2, lambda i: (_image(i), i)), batch_size=FULL)
    list(prepared_steps(loader, Preparer(), BOUNDS, 0, None, counting_cut))
    assert cut == [2]  # only the short last step was collated whole
    cut.clear()
    named = DataLoader(Samples(2 * FULL, lambda i: (_image(i), f"s{i}")), batch_size=FULL)
    list(prepared_steps(named, Preparer(), BOUNDS, 0, None, counting_cut))
    assert cut == [FULL, FULL]  # a string column: every step whole (strings reach every rank)


def test_sequences_of_unequal_length_fail_as_default_collate_fails() -> None:
    def ragged(i: int) -> Sequence[torch.Tensor]:
        return [torch.zeros(1)] * (1 + i % 2)

    loader = DataLoader(Samples(FULL, ragged), batch_size=FULL)
    with pytest.raises(RuntimeError, match="equal size"):
        list(prepared_steps(loader, Preparer(), BOUNDS, 0, None, _cut))


def test_only_default_collate_without_workers_is_loaded_piecewise() -> None:
    dataset = Samples(FULL, _image)
    assert not pieces_supported(DataLoader(dataset, batch_size=2, collate_fn=lambda b: b))
    assert not pieces_supported(DataLoader(dataset, batch_size=2, num_workers=1))
    assert not pieces_supported(DataLoader(dataset, batch_size=None))
