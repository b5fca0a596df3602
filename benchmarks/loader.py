"""Data loader benchmark: per-batch cost of the prepared loaders against a plain DataLoader.

Run from the repository root::

    .venv/bin/python benchmarks/loader.py            # or: make bench

Two worker processes (``nb_accel.notebook_launcher``, fork, gloo on the CPU). In one launch, for
each workload, four contenders are timed epoch by epoch, alternating within every round:

- plain: each process iterates an ordinary ``DataLoader`` (the per-process batch size), as many
  batches as a shard holds. The baseline every ratio is taken against.
- shard: ``prepare_data_loader(..., dispatch_batches=False)``, a ``DataLoaderShard``.
- dispatch: ``prepare_data_loader(..., dispatch_batches=True)``, a ``DataLoaderDispatcher``:
  process 0 loads every batch and sends the other process its half.
- floor: process 0 alone iterates a plain ``DataLoader`` whose batch is the global batch (both
  processes' samples) while process 1 waits: the loading a dispatcher cannot avoid.

The figure is the time per batch (one epoch's time divided by its batches) on the slower process,
median over the rounds, after a warm-up epoch per loader (connection set-up, first-touch memory).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist
from machine import run_header
from torch.utils.data import DataLoader, TensorDataset

import nb_accel
from nb_accel.runtime.data.loaders import prepare_data_loader

WORLD_SIZE = 2
DISPATCH_TARGET = 2.0  # dispatcher / shard
#: name -> (shape of one sample, per-process batch size)
WORKLOADS: dict[str, tuple[tuple[int, ...], int]] = {
    "images 3x32x32 f32, batch 64": ((3, 32, 32), 64),
    "features 64 f32, batch 64": ((64,), 64),
    "images 3x32x32 f32, batch 16": ((3, 32, 32), 16),
}
CONTENDERS = ("plain", "shard", "dispatch", "floor")
ACCELERATE = "accelerate"


def _accelerate_dispatcher(loader: DataLoader) -> object | None:  # type: ignore[type-arg]
    """Accelerate's ``DataLoaderDispatcher`` around ``loader``; None without accelerate."""
    try:
        os.environ["ACCELERATE_USE_CPU"] = "1"  # else Accelerate ignores the CPU process group
        from accelerate.data_loader import prepare_data_loader as accelerate_prepare
        from accelerate.state import PartialState
    except ImportError:
        return None
    PartialState(cpu=True)
    return accelerate_prepare(
        loader,
        device=torch.device("cpu"),
        num_processes=WORLD_SIZE,
        process_index=dist.get_rank(),
        put_on_device=True,
        dispatch_batches=True,
    )


def _epoch(loader: Iterable[object], steps: int) -> float:
    """Seconds per batch for ``steps`` batches of ``loader``."""
    start = time.perf_counter()
    count = 0
    for _ in itertools.islice(loader, steps):
        count += 1
    return (time.perf_counter() - start) / max(count, 1)


def _loaders(
    shape: tuple[int, ...], batch: int, samples: int, accelerate: bool
) -> dict[str, object]:
    torch.manual_seed(0)
    dataset = TensorDataset(torch.randn(samples, *shape), torch.randint(0, 10, (samples,)))
    theirs = _accelerate_dispatcher(DataLoader(dataset, batch_size=batch)) if accelerate else None
    return ({ACCELERATE: theirs} if theirs is not None else {}) | {
        "plain": DataLoader(dataset, batch_size=batch),
        "shard": prepare_data_loader(DataLoader(dataset, batch_size=batch), dispatch_batches=False),
        "dispatch": prepare_data_loader(
            DataLoader(dataset, batch_size=batch), dispatch_batches=True
        ),
        "floor": DataLoader(dataset, batch_size=batch * WORLD_SIZE),
    }


def measure(samples: int, rounds: int, accelerate: bool) -> dict[str, dict[str, list[float]]]:
    """Worker: seconds per batch of every contender and workload, one list entry per round."""
    rank = dist.get_rank()
    results: dict[str, dict[str, list[float]]] = {}
    for name, (shape, batch) in WORKLOADS.items():
        loaders = _loaders(shape, batch, samples, accelerate)
        contenders = tuple(c for c in (*CONTENDERS, ACCELERATE) if c in loaders)
        steps = samples // (batch * WORLD_SIZE)
        timings: dict[str, list[float]] = {c: [] for c in contenders}
        for index in range(rounds + 1):  # round 0 warms every loader up
            order = contenders if index % 2 == 0 else contenders[::-1]
            for contender in order:
                dist.barrier()
                if contender == "floor" and rank != 0:
                    seconds = 0.0  # process 1 only waits: the floor is process 0's loading
                else:
                    seconds = _epoch(loaders[contender], steps)  # type: ignore[arg-type]
                dist.barrier()
                if index > 0:
                    timings[contender].append(seconds)
        results[name] = timings
    return results


#: Per rank: workload -> contender -> seconds per batch, one entry per round.
Timings = list[dict[str, dict[str, list[float]]]]


def _slower(ranks: Timings, name: str, who: str) -> list[float]:
    """The slower process's seconds per batch, one entry per round."""
    return [max(per_rank) for per_rank in zip(*(rank[name][who] for rank in ranks), strict=True)]


def _per_batch_us(ranks: Timings, name: str, who: str) -> float:
    """Median over rounds of the slower process's time per batch, in microseconds."""
    return statistics.median(_slower(ranks, name, who)) * 1e6


def _paired(ranks: Timings, name: str, who: str, base: str) -> float:
    """Median over rounds of ``who``'s time divided by ``base``'s time in the same round."""
    pairs = zip(_slower(ranks, name, who), _slower(ranks, name, base), strict=True)
    return statistics.median(a / b for a, b in pairs)


LABELS = {
    "plain": "plain DataLoader (baseline)",
    "shard": "DataLoaderShard",
    "dispatch": "DataLoaderDispatcher",
    "floor": "floor: process 0 loads the global batch",
    ACCELERATE: "Accelerate's DataLoaderDispatcher",
}


def report(ranks: list[dict[str, dict[str, list[float]]]], print_: Callable[..., None]) -> None:
    """Print one table per workload, with the ratios and the dispatcher target."""
    for name in WORKLOADS:
        present = [who for who in (*CONTENDERS, ACCELERATE) if who in ranks[0][name]]
        costs = {who: _per_batch_us(ranks, name, who) for who in present}
        print_(f"{name}")
        for who in present:
            ratio = costs[who] / costs["plain"]
            print_(f"  {LABELS[who]:<42} {costs[who]:9.1f} us  {ratio:6.2f}x")
        shard_ratio = _paired(ranks, name, "dispatch", "shard")
        verdict = "PASS" if shard_ratio <= DISPATCH_TARGET else "MISS"
        print_(
            f"  paired per round: dispatcher / shard {shard_ratio:.2f}x "
            f"(target <= {DISPATCH_TARGET}x: {verdict}); "
            f"floor / shard {_paired(ranks, name, 'floor', 'shard'):.2f}x; "
            f"dispatcher / floor {_paired(ranks, name, 'dispatch', 'floor'):.2f}x"
        )
        if ACCELERATE in costs:
            faster = 1 / _paired(ranks, name, "dispatch", ACCELERATE)
            print_(f"  nb_accel's dispatcher is {faster:.1f}x faster than Accelerate's")
        print_("")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=16384, help="dataset size")
    parser.add_argument("--rounds", type=int, default=9, help="timed epochs per contender")
    parser.add_argument(
        "--no-accelerate", action="store_true", help="leave out Accelerate's dispatcher"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print the tables."""
    args = parse_args(argv)
    print(run_header(torch=torch.__version__, nb_accel=nb_accel.__version__))
    print(
        f"Data loader per-batch cost, {WORLD_SIZE} processes (fork, gloo, CPU), "
        f"{args.samples} samples; median of {args.rounds} epochs after a warm-up epoch, "
        "slower process\n"
    )
    ranks = nb_accel.notebook_launcher(
        measure, args=(args.samples, args.rounds, not args.no_accelerate), num_processes=WORLD_SIZE
    )
    report(ranks, print)


if __name__ == "__main__":
    main()
