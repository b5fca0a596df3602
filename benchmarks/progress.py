"""Progress benchmark: what ``nb_accel.tqdm`` costs inside a worker, and what reaches the kernel.

Run from the repository root::

    .venv/bin/python benchmarks/progress.py            # or: make bench

One launch of 2 worker processes (fork, gloo, CPU). In each worker, alternating within every
round, over ``--items`` iterations:

- bare: ``for _ in range(n): pass`` (the baseline);
- tqdm: ``for _ in tqdm.tqdm(range(n), file=<devnull>): pass`` (plain tqdm drawing to nothing);
- nb_accel: ``for _ in nb_accel.tqdm(range(n)): pass`` (reported to the kernel).

The figure is the extra time per iteration over the bare loop (median over rounds, slower rank).
Then each rank runs a longer ``nb_accel.tqdm`` loop while the kernel counts the reports that
arrive (a counting launch view): messages per second per rank.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import torch
import tqdm as tqdm_module
from machine import run_header

import nb_accel
from nb_accel._messages import Report
from nb_accel.launch.views.view import NullView, register_view_factory, view_factory

WORLD_SIZE = 2
COST_TARGET_US = 1.0
RATE_TARGET = 10.0
LONG = "long loop"


def _loop(kind: str, items: int) -> float:
    """Seconds for one loop of ``items`` iterations."""
    start = time.perf_counter()
    if kind == "bare":
        for _ in range(items):
            pass
    elif kind == "tqdm":
        with open(os.devnull, "w") as sink:
            for _ in tqdm_module.tqdm(range(items), file=sink):
                pass
    else:
        for _ in nb_accel.tqdm(range(items)):
            pass
    return time.perf_counter() - start


def measure(items: int, rounds: int, rate_seconds: float) -> dict[str, Any]:
    """Worker: seconds per loop for each kind and round, then the long reported loop."""
    kinds = ("bare", "tqdm", "nb_accel")
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    for index in range(rounds + 1):
        for kind in kinds if index % 2 == 0 else kinds[::-1]:
            seconds = _loop(kind, items)
            if index > 0:  # round 0 warms up
                times[kind].append(seconds)
    long_items = max(1, int(items * rate_seconds / max(min(times["nb_accel"]), 1e-9)))
    start = time.perf_counter()
    for _ in nb_accel.tqdm(range(long_items), desc=LONG):
        pass
    return {"times": times, "long_seconds": time.perf_counter() - start}


class CountingView(NullView):
    """A launch view that only counts each rank's reports about the long loop's bar."""

    def __init__(self) -> None:
        self.reports: dict[int, int] = {}

    def report(self, event: Report) -> None:
        """Count it when it is about the long loop."""
        if any(bar.desc == LONG for bar in event.bars):
            self.reports[event.rank] = self.reports.get(event.rank, 0) + 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1_000_000, help="iterations per loop")
    parser.add_argument("--rounds", type=int, default=7, help="timed loops per kind")
    parser.add_argument("--rate-seconds", type=float, default=3.0, help="long loop length")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print the table."""
    args = parse_args(argv)
    print(
        run_header(
            torch=torch.__version__, tqdm=tqdm_module.__version__, nb_accel=nb_accel.__version__
        )
    )
    counter = CountingView()
    previous = view_factory()
    register_view_factory(lambda title, world_size, all_ranks: counter)
    try:
        ranks = nb_accel.notebook_launcher(
            measure, args=(args.items, args.rounds, args.rate_seconds), num_processes=WORLD_SIZE
        )
    finally:
        register_view_factory(previous)
    print(
        f"\nProgress bar cost inside a worker, {args.items:,} iterations, "
        f"{WORLD_SIZE} processes; median of {args.rounds} rounds, slower rank"
    )
    bare = statistics.median(max(r["times"]["bare"][i] for r in ranks) for i in range(args.rounds))
    print(f"  {'contender':<34} {'loop s':>8} {'extra us/it':>12}")
    costs = {}
    for kind, label in (
        ("bare", "bare loop (baseline)"),
        ("tqdm", "tqdm, drawing to /dev/null"),
        ("nb_accel", "nb_accel.tqdm, reported"),
    ):
        rounds = [max(r["times"][kind][i] for r in ranks) for i in range(args.rounds)]
        seconds = statistics.median(rounds)
        costs[kind] = (seconds - bare) / args.items * 1e6
        print(f"  {label:<34} {seconds:8.3f} {costs[kind]:12.3f}")
    verdict = "PASS" if costs["nb_accel"] <= COST_TARGET_US else "MISS"
    print(f"  target nb_accel.tqdm <= {COST_TARGET_US} us per iteration: {verdict}")
    print(f"  nb_accel.tqdm / tqdm extra cost: {costs['nb_accel'] / max(costs['tqdm'], 1e-9):.2f}x")
    print("\nReports reaching the kernel during a long nb_accel.tqdm loop")
    worst = 0.0
    for rank, result in enumerate(ranks):
        rate = counter.reports.get(rank, 0) / result["long_seconds"]
        worst = max(worst, rate)
        print(
            f"  rank {rank}: {counter.reports.get(rank, 0)} reports in a "
            f"{result['long_seconds']:.2f} s loop: {rate:.1f} per second"
        )
    verdict = "PASS" if worst <= RATE_TARGET else "MISS"
    print(f"  target <= {RATE_TARGET:.0f} per second per rank: {verdict}")


if __name__ == "__main__":
    main()
