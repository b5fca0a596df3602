"""Prepared data loaders on real worker groups: shuffling in step, dispatching, exact metrics,
DataLoader workers inside launched workers, and the loader state the training loop reads."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    IterableDataset,
    SequentialSampler,
    TensorDataset,
)

from nb_accel import notebook_launcher
from nb_accel.runtime.collectives.ops import gather_for_metrics
from nb_accel.runtime.data.loader_dispatch import DataLoaderDispatcher
from nb_accel.runtime.data.loader_shard import DataLoaderShard
from nb_accel.runtime.data.loaders import prepare_data_loader, skip_first_batches
from nb_accel.runtime.state import GradientState, PartialState


class Rows(Dataset):  # type: ignore[type-arg]
    """Sample ``i`` is ``{"x": [i, -i] as floats, "y": i}`` plus the pid that loaded it."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"x": torch.tensor([float(i), -float(i)]), "y": i, "pid": os.getpid()}


class Stream(IterableDataset):  # type: ignore[type-arg]
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[torch.Tensor]:
        return (torch.tensor(i) for i in range(self.n))

    def __len__(self) -> int:
        return self.n


def _indices(loader: Any) -> list[int]:
    return [int(i) for batch in loader for i in batch]


def shuffled_epochs() -> dict[str, Any]:
    rank = dist.get_rank()
    torch.manual_seed(100 + rank)  # every rank's global generator differs

    def loader() -> DataLoader:  # type: ignore[type-arg]
        own = torch.Generator().manual_seed(rank)  # and so does the loader's
        return DataLoader(range(20), batch_size=2, shuffle=True, generator=own)

    synced = prepare_data_loader(loader(), rng_types=["generator"])
    unsynced = prepare_data_loader(loader(), rng_types=None)
    torch.manual_seed(rank)
    torch_synced = prepare_data_loader(DataLoader(range(4), batch_size=2), rng_types=["torch"])
    draws = [torch.rand(1).item() for _ in torch_synced]
    seedable = prepare_data_loader(
        DataLoader(range(20), batch_size=2, shuffle=True), use_seedable_sampler=True
    )
    plain = prepare_data_loader(
        DataLoader(range(20), batch_size=2, shuffle=True), rng_types=["generator"]
    )
    return {
        "epochs": [_indices(synced) for _ in range(3)],
        "unsynced": _indices(unsynced),
        "draws": draws,
        "seedable": [_indices(seedable) for _ in range(2)],
        "default_generator": [_indices(plain) for _ in range(2)],
    }


def test_shuffling_agrees_across_ranks_and_changes_every_epoch() -> None:
    ranks = notebook_launcher(shuffled_epochs, num_processes=2)
    permutations = []
    for epoch in range(3):
        zero, one = ranks[0]["epochs"][epoch], ranks[1]["epochs"][epoch]
        assert sorted(zero + one) == list(range(20)), f"epoch {epoch}: shards overlap"
        batches = [zero[i : i + 2] + one[i : i + 2] for i in range(0, 10, 2)]
        permutations.append([i for pair in batches for i in pair])
    assert len({tuple(p) for p in permutations}) == 3
    assert permutations[0] != list(range(20))
    # Without synchronisation the ranks shuffle differently: the check above can fail.
    assert sorted(ranks[0]["unsynced"] + ranks[1]["unsynced"]) != list(range(20))
    assert ranks[0]["draws"] == ranks[1]["draws"]
    for key in ("seedable", "default_generator"):  # no generator of the user's: still agreed
        for epoch in range(2):
            assert sorted(ranks[0][key][epoch] + ranks[1][key][epoch]) == list(range(20)), key
        assert ranks[0][key][0] != ranks[0][key][1], key


def _contents(loader: Any) -> list[tuple[list[float], list[int]]]:
    return [(batch["x"][:, 0].tolist(), batch["y"].tolist()) for batch in loader]


def dispatch_versus_shard() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for split in (False, True):
        base = DataLoader(Rows(50), batch_size=4)
        shard = prepare_data_loader(base, split_batches=split, dispatch_batches=False)
        dispatch = prepare_data_loader(base, split_batches=split, dispatch_batches=True)
        assert isinstance(shard, DataLoaderShard) and isinstance(dispatch, DataLoaderDispatcher)
        out[f"split={split}"] = (_contents(shard), _contents(dispatch), len(shard), len(dispatch))
    stream = DataLoader(Stream(30), batch_size=4)
    out["iterable"] = (
        [b.tolist() for b in prepare_data_loader(stream, dispatch_batches=False)][:-1],
        [b.tolist() for b in prepare_data_loader(stream)][:-1],  # dispatched by default
    )
    dispatch = prepare_data_loader(base, dispatch_batches=True)
    out["skipped"] = (_contents(skip_first_batches(dispatch, 2)), _contents(dispatch)[2:])
    return out


def test_dispatcher_gives_each_rank_what_the_shard_loader_gives() -> None:
    for out in notebook_launcher(dispatch_versus_shard, num_processes=2):
        for split in (False, True):
            shard, dispatch, shard_len, dispatch_len = out[f"split={split}"]
            assert shard[:-1] == dispatch[:-1]  # the last batch is completed differently
            assert len(shard) == shard_len and len(dispatch) == dispatch_len
        assert out["iterable"][0] == out["iterable"][1]
        assert out["skipped"][0] == out["skipped"][1]


MODES: dict[str, dict[str, Any]] = {
    "shard": {},
    "dispatch": {"dispatch_batches": True},
    "split": {"split_batches": True},
    "split_dispatch": {"split_batches": True, "dispatch_batches": True},
    "uneven": {"even_batches": False},
    "uneven_dispatch": {"even_batches": False, "dispatch_batches": True},
    "uneven_split": {"even_batches": False, "split_batches": True},
}


def _metrics(loader: Any, as_objects: bool = False) -> list[int]:
    state = GradientState()
    seen: list[int] = []
    for batch in loader:
        if isinstance(batch, torch.Tensor):
            seen += gather_for_metrics(batch, state, 2).tolist()
        elif as_objects:
            seen += gather_for_metrics(batch["y"].tolist(), state, dist.get_world_size(), True)
        else:
            x, y = gather_for_metrics((batch["x"], batch["y"]), state, dist.get_world_size())
            assert x[:, 0].long().tolist() == y.tolist()
            seen += y.tolist()
    return seen


def metrics_in_every_mode(batch_size: int) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for n in (82, 99, 512):
        base = DataLoader(Rows(n), batch_size=batch_size)
        for mode, options in MODES.items():
            out[f"{mode}/{n}"] = _metrics(prepare_data_loader(base, **options))
        out[f"objects/{n}"] = _metrics(prepare_data_loader(base), as_objects=True)
        uneven = prepare_data_loader(base, even_batches=False)
        out[f"uneven_objects/{n}"] = _metrics(uneven, as_objects=True)
        dropping = DataLoader(Rows(n), batch_size=batch_size, drop_last=True)
        for mode in ("shard", "dispatch"):
            loader = prepare_data_loader(dropping, dispatch_batches=mode == "dispatch")
            out[f"drop_last_{mode}/{n}"] = _metrics(loader)
        sampler = BatchSampler(SequentialSampler(range(n)), batch_size, drop_last=True)
        by_sampler = DataLoader(Rows(n), batch_sampler=sampler)  # the loader's drop_last: False
        out[f"drop_last_sampler/{n}"] = _metrics(prepare_data_loader(by_sampler))
        if dist.get_world_size() == 2:
            stream = DataLoader(Stream(n), batch_size=batch_size)
            out[f"iterable/{n}"] = _metrics(prepare_data_loader(stream))
            out[f"iterable_shard/{n}"] = _metrics(
                prepare_data_loader(stream, dispatch_batches=False)
            )
    return out


def _check_exact(ranks: list[dict[str, list[int]]], batch_size: int) -> None:
    for key, seen in ranks[0].items():
        n = int(key.split("/")[1])
        if key.startswith("drop_last"):  # whole steps only: every process's full batch
            step = batch_size * len(ranks)
            n -= n % step
        assert seen == list(range(n)), key
        for other in ranks[1:]:  # a rank left without a last batch too (even_batches=False)
            assert other[key] == seen, key


def test_gather_for_metrics_returns_exactly_the_dataset_on_two_ranks() -> None:
    _check_exact(notebook_launcher(metrics_in_every_mode, args=(16,), num_processes=2), 16)


def test_gather_for_metrics_returns_exactly_the_dataset_on_three_ranks() -> None:
    _check_exact(notebook_launcher(metrics_in_every_mode, args=(15,), num_processes=3), 15)


def with_loader_workers() -> dict[str, Any]:
    out: dict[str, Any] = {"pid": os.getpid()}
    for dispatch in (False, True):
        plain = prepare_data_loader(DataLoader(Rows(40), batch_size=4), dispatch_batches=dispatch)
        workers = prepare_data_loader(
            DataLoader(Rows(40), batch_size=4, num_workers=2, persistent_workers=True),
            dispatch_batches=dispatch,
        )
        twice = [[(b["y"].tolist(), b["pid"].tolist()) for b in workers] for _ in range(2)]
        out[f"dispatch={dispatch}"] = (_contents(plain), twice)
        del workers  # shuts its persistent workers down
    return out


def test_loader_workers_run_inside_launched_workers() -> None:
    ranks = notebook_launcher(with_loader_workers, num_processes=2)
    for out in ranks:
        for dispatch in (False, True):
            plain, twice = out[f"dispatch={dispatch}"]
            for epoch in twice:
                assert [y for y, _ in epoch] == [y for _, y in plain]
                pids = {pid for _, pids in epoch for pid in pids}
                assert out["pid"] not in pids and len(pids) >= 1


def loader_state() -> dict[str, Any]:
    state = GradientState()
    out: dict[str, Any] = {}
    for dispatch in (False, True):
        loader = prepare_data_loader(DataLoader(Rows(10), batch_size=2), dispatch_batches=dispatch)
        steps = []
        for batch in loader:
            steps.append(
                (
                    batch["y"].tolist(),
                    loader.end_of_dataloader,
                    loader.remainder,
                    state.end_of_dataloader,
                    state.remainder,
                )
            )
        out[f"dispatch={dispatch}"] = (steps, state.active_dataloader is None)
    outer = prepare_data_loader(DataLoader(Rows(8), batch_size=2))
    inner = prepare_data_loader(DataLoader(Rows(4), batch_size=2))
    nested = []
    for _ in outer:
        for _ in inner:
            nested.append(state.active_dataloader is inner)
        nested.append(state.active_dataloader is outer)
    for _ in outer:
        break
    out["nested"] = (nested, state.active_dataloader is None)
    return out


def test_end_of_dataloader_and_remainder() -> None:
    ranks = notebook_launcher(loader_state, num_processes=2)
    shard_expected = [
        [([0, 1], False, 2, False, 2), ([4, 5], False, 2, False, 2), ([8, 9], True, 2, True, 2)],
        [([2, 3], False, 2, False, 2), ([6, 7], False, 2, False, 2), ([0, 1], True, 2, True, 2)],
    ]
    # The dispatcher's last step: 2 samples, split one per rank.
    dispatch_expected = [
        [([0, 1], False, 2, False, 2), ([4, 5], False, 2, False, 2), ([8], True, 2, True, 2)],
        [([2, 3], False, 2, False, 2), ([6, 7], False, 2, False, 2), ([9], True, 2, True, 2)],
    ]
    for rank, out in enumerate(ranks):
        assert out["dispatch=False"] == (shard_expected[rank], True)
        assert out["dispatch=True"] == (dispatch_expected[rank], True)
        assert out["nested"] == ([True, True] * 2, True)


def _ragged(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Collate into a batch whose shape changes from step to step, with a list of strings."""
    width = 1 + (int(rows[0]["y"]) // 6) % 3
    return {
        "x": torch.stack([r["x"][:1].repeat(width) for r in rows]),
        "name": [f"s{r['y']}" for r in rows],
    }


def _named(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"y": torch.tensor([r["y"] for r in rows]), "name": [f"s{r['y']}" for r in rows]}


def _no_features(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"x": torch.zeros(len(rows), 0), "y": [r["y"] for r in rows]}


def dispatcher_iterations(portable: bool) -> dict[str, Any]:
    if portable:  # force the point-to-point link used across nodes or with NCCL
        from nb_accel.runtime.data import loader_dispatch

        loader_dispatch.local_link_available = lambda state: False  # type: ignore[assignment]
    loader = prepare_data_loader(DataLoader(Rows(40), batch_size=4), dispatch_batches=True)
    started = []
    for batch in loader:
        started.append(batch["y"].tolist())
        if len(started) == 2:
            break  # abandoned: the next iteration must not see what was under way
    ragged = prepare_data_loader(
        DataLoader(Rows(30), batch_size=3, collate_fn=_ragged), dispatch_batches=True
    )
    uneven = DataLoader(Rows(99), batch_size=16)
    return {
        "link": type(loader._link_end).__name__,
        "started": started,
        "full": [b["y"].tolist() for b in loader],
        "again": [b["y"].tolist() for b in loader],
        "ragged": [(b["x"].tolist(), b["name"]) for b in ragged],
        "metrics": _metrics(prepare_data_loader(uneven, dispatch_batches=True, even_batches=False)),
        "no_features": [  # tensors of zero bytes: nothing to put in the shared memory
            tuple(b["x"].shape)
            for b in prepare_data_loader(
                DataLoader(Rows(8), batch_size=2, collate_fn=_no_features), dispatch_batches=True
            )
        ],
        # The last step (1 sample) is completed from the first batch; the list is not a row.
        "named_tail": [
            (b["y"].tolist(), b["name"])
            for b in prepare_data_loader(
                DataLoader(Rows(5), batch_size=2, collate_fn=_named), dispatch_batches=True
            )
        ],
    }


def test_dispatcher_links_resume_after_an_abandoned_iteration() -> None:
    for portable, link in ((False, "Local"), (True, "Gloo")):
        ranks = notebook_launcher(dispatcher_iterations, args=(portable,), num_processes=2)
        for rank, out in enumerate(ranks):
            assert out["link"] == f"{link}{'Sender' if rank == 0 else 'Receiver'}"
            assert out["started"] == out["full"][:2]
            assert out["full"] == out["again"]
            assert out["full"][0] == [4 * rank + i for i in range(4)]
            assert len(out["ragged"]) == 5
            for step, (x, names) in enumerate(out["ragged"]):
                first = 6 * step + 3 * rank
                assert x == [[float(first + i)] * (1 + step % 3) for i in range(3)]
                # As in Accelerate, slicing cuts tensors only: lists reach every rank whole.
                assert names == [f"s{6 * step + i}" for i in range(6)]
            assert out["no_features"] == [(2, 0), (2, 0)]
            assert out["named_tail"] == [
                ([2 * rank, 2 * rank + 1], ["s0", "s1", "s2", "s3"]),
                ([4 if rank == 0 else 0], ["s4"]),
            ]
        assert ranks[0]["metrics"] == list(range(99))


def test_single_process_loader_gathers_nothing_away() -> None:
    state = PartialState()
    loader = prepare_data_loader(DataLoader(Rows(5), batch_size=2), dispatch_batches=True)
    seen = [gather_for_metrics(b["y"], GradientState(), state.num_processes) for b in loader]
    assert [t.tolist() for t in seen] == [[0, 1], [2, 3], [4]]
    assert loader.remainder == 1
    assert len(TensorDataset(torch.zeros(1))) == 1


class BrokenSample(Exception):
    """Raised by the dataset on process 0, the only one that loads when dispatching."""


class Broken(Rows):
    def __getitem__(self, i: int) -> dict[str, Any]:
        if i == 13:
            raise BrokenSample(f"sample {i} is corrupt")
        return super().__getitem__(i)


def dispatch_broken(portable: bool) -> int:
    if portable:
        from nb_accel.runtime.data import loader_dispatch

        loader_dispatch.local_link_available = lambda state: False  # type: ignore[assignment]
    loader = prepare_data_loader(DataLoader(Broken(40), batch_size=2), dispatch_batches=True)
    return sum(len(batch["y"]) for batch in loader)


def test_dataset_error_on_process_0_is_what_the_user_sees() -> None:
    for portable in (False, True):  # the others, waiting for their slice, are torn down
        with pytest.raises(BrokenSample, match="sample 13 is corrupt") as info:
            notebook_launcher(dispatch_broken, args=(portable,), num_processes=2)
        assert any("rank 0 of 2" in note for note in info.value.__notes__)


class ReadyBatches(IterableDataset):  # type: ignore[type-arg]
    """Yields ready-made batches ``[0, 1], [2, 3], ...`` (a loader with ``batch_size=None``)."""

    def __init__(self, batches: int) -> None:
        self.batches = batches

    def __iter__(self) -> Iterator[torch.Tensor]:
        return (torch.tensor([2 * i, 2 * i + 1]) for i in range(self.batches))

    def __len__(self) -> int:
        return self.batches


def ready_made_batches() -> dict[str, Any]:
    out: dict[str, Any] = {}
    options: dict[str, dict[str, Any]] = {
        "defaults": {},
        "uneven": {"even_batches": False},
        "shard": {"dispatch_batches": False},
        "uneven_shard": {"even_batches": False, "dispatch_batches": False},
    }
    for name, kwargs in options.items():
        loader = prepare_data_loader(DataLoader(ReadyBatches(4), batch_size=None), **kwargs)
        out[name] = ([batch.tolist() for batch in loader], len(loader))
    return out


def test_ready_made_batches_go_whole_to_each_process_in_turn() -> None:
    ranks = notebook_launcher(ready_made_batches, num_processes=2)
    for name in ("defaults", "uneven", "shard", "uneven_shard"):
        assert ranks[0][name] == ([[0, 1], [4, 5]], 2), name
        assert ranks[1][name] == ([[2, 3], [6, 7]], 2), name


def two_gathers_per_step() -> None:
    loader = prepare_data_loader(DataLoader(range(6), batch_size=2), even_batches=False)
    state = GradientState()
    for batch in loader:  # rank 0: two batches, rank 1: one
        gather_for_metrics(batch, state, 2)
        gather_for_metrics(batch, state, 2)


def test_gathers_out_of_step_at_an_uneven_end_raise_instead_of_mixing() -> None:
    with pytest.raises(RuntimeError, match="once per batch on every process"):
        notebook_launcher(two_gathers_per_step, num_processes=2)
