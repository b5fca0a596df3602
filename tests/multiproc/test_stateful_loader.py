"""Loaders prepared with ``DataLoaderConfiguration(data_seed=...)`` and
``use_stateful_dataloader=True`` on real two-process groups: the seed alone sets the order, and
a loader resumed from its ``state_dict()`` in a new launch continues with the next batch."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, IterableDataset

from nb_accel import Accelerator, DataLoaderConfiguration, notebook_launcher

pytest.importorskip("torchdata.stateful_dataloader")
from torchdata.stateful_dataloader import StatefulDataLoader


class Squares(Dataset):  # type: ignore[type-arg]
    """Sample ``i`` is ``{"i": i, "sq": i * i}``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"i": i, "sq": torch.tensor(float(i * i))}


class Counting(IterableDataset):  # type: ignore[type-arg]
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Any:
        return iter(range(self.n))


def seeded_order(data_seed: int, torch_seed: int) -> list[int]:
    """One epoch of a shuffled loader seeded by ``data_seed``, as this rank sees it."""
    torch.manual_seed(torch_seed + dist.get_rank())  # differs between ranks and launches
    config = DataLoaderConfiguration(use_seedable_sampler=True, data_seed=data_seed)
    accelerator = Accelerator(dataloader_config=config)
    loader = accelerator.prepare(DataLoader(range(24), batch_size=3, shuffle=True))
    return [int(i) for batch in loader for i in batch]


def _global(ranks: list[list[int]]) -> list[int]:
    """The dataset's order: rank 0's batch, then rank 1's, step by step."""
    steps = zip(*(zip(*[iter(r)] * 3, strict=True) for r in ranks), strict=True)
    return [i for step in steps for batch in step for i in batch]


@pytest.mark.timeout(240)
def test_data_seed_alone_decides_the_order_on_every_rank() -> None:
    first = notebook_launcher(seeded_order, args=(7, 100), num_processes=2)
    again = notebook_launcher(seeded_order, args=(7, 200), num_processes=2)
    other = notebook_launcher(seeded_order, args=(8, 100), num_processes=2)
    for ranks in (first, again, other):  # the ranks agree: each sample once
        assert sorted(_global(ranks)) == list(range(24))
    assert _global(first) != list(range(24))
    assert first == again
    assert _global(first) != _global(other)


#: Loader settings: (name, DataLoaderConfiguration options, dataset, DataLoader options).
CASES: list[tuple[str, dict[str, Any], str, dict[str, Any]]] = [
    ("shard", {}, "map", {"shuffle": True}),
    ("shard-split", {"split_batches": True}, "map", {"shuffle": True}),
    ("shard-seedable", {"use_seedable_sampler": True}, "map", {"shuffle": True}),
    ("shard-workers", {}, "map", {"shuffle": True, "num_workers": 2}),
    ("dispatch", {"dispatch_batches": True}, "map", {"shuffle": True}),
    ("dispatch-split", {"dispatch_batches": True, "split_batches": True}, "map", {}),
    ("dispatch-iterable", {}, "iterable", {}),
]


def _batches(loader: Any, stop_after: int | None = None) -> tuple[list[Any], Any]:
    """Every batch of one epoch, as plain lists, and the state after ``stop_after`` batches."""
    seen, state = [], None
    for index, batch in enumerate(loader):
        rows = batch["i"] if isinstance(batch, dict) else batch
        seen.append([int(i) for i in rows])
        if index + 1 == stop_after:
            state = loader.state_dict()
    return seen, state


def interrupted(case: int, states: list[Any] | None) -> dict[str, Any]:
    """Without ``states``: epochs 0 to 2, with the state after 2 batches of epoch 1. With
    them: a new loader loads this rank's state, then runs the rest of epoch 1 and epoch 2."""
    _, options, kind, loader_options = CASES[case]
    torch.manual_seed(1000 * (states is not None) + dist.get_rank())
    config = DataLoaderConfiguration(use_stateful_dataloader=True, **options)
    accelerator = Accelerator(dataloader_config=config)
    dataset = Squares(40) if kind == "map" else Counting(40)
    loader = accelerator.prepare(DataLoader(dataset, batch_size=4, **loader_options))
    assert isinstance(loader, StatefulDataLoader)
    if states is None:
        epoch0, _ = _batches(loader)
        epoch1, state = _batches(loader, stop_after=2)
        epoch2, _ = _batches(loader)
        return {"epochs": [epoch0, epoch1, epoch2], "state": state}
    loader.load_state_dict(states[dist.get_rank()])
    rest, _ = _batches(loader)
    epoch2, _ = _batches(loader)
    return {"rest": rest, "epoch2": epoch2}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", range(len(CASES)), ids=[c[0] for c in CASES])
def test_a_resumed_loader_continues_with_the_next_batch(case: int) -> None:
    before = notebook_launcher(interrupted, args=(case, None), num_processes=2)
    states = [rank["state"] for rank in before]
    after = notebook_launcher(interrupted, args=(case, states), num_processes=2)
    for rank in range(2):
        epochs = before[rank]["epochs"]
        assert len(epochs[1]) > 2
        if CASES[case][3].get("shuffle"):
            assert epochs[0] != epochs[1]  # shuffled anew: resuming must find epoch 1's order
        assert after[rank]["rest"] == epochs[1][2:], f"rank {rank}"
        assert after[rank]["epoch2"] == epochs[2], f"rank {rank}"


def checkpointed(case: int, folder: str, resume: bool) -> dict[str, Any]:
    """As :func:`interrupted`, with ``save_state`` / ``load_state`` instead of the state dict
    (and no ``skip_first_batches``: the loader's own position is restored)."""
    _, options, _, loader_options = CASES[case]
    torch.manual_seed(1000 * resume + dist.get_rank())
    config = DataLoaderConfiguration(use_stateful_dataloader=True, **options)
    accelerator = Accelerator(dataloader_config=config)
    loader = accelerator.prepare(DataLoader(Squares(40), batch_size=4, **loader_options))
    if not resume:
        epoch0, _ = _batches(loader)
        epoch1 = []
        for index, batch in enumerate(loader):
            epoch1.append([int(i) for i in batch["i"]])
            if index == 1:
                accelerator.save_state(folder)
        epoch2, _ = _batches(loader)
        return {"epochs": [epoch0, epoch1, epoch2]}
    accelerator.load_state(folder)
    rest, _ = _batches(loader)
    epoch2, _ = _batches(loader)
    return {"rest": rest, "epoch2": epoch2}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", [0, 2, 4], ids=[CASES[c][0] for c in (0, 2, 4)])
def test_load_state_resumes_a_stateful_loader_at_the_next_batch(case: int, tmp_path: Any) -> None:
    folder = str(tmp_path / "state")
    before = notebook_launcher(checkpointed, args=(case, folder, False), num_processes=2)
    after = notebook_launcher(checkpointed, args=(case, folder, True), num_processes=2)
    for rank in range(2):
        epochs = before[rank]["epochs"]
        assert epochs[0] != epochs[1]
        assert after[rank]["rest"] == epochs[1][2:], f"rank {rank}"
        assert after[rank]["epoch2"] == epochs[2], f"rank {rank}"
