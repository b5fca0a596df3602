"""Warm workers: a repeat launch on them against a cold launch, from the same run.

Run from the repository root::

    .venv/bin/python benchmarks/warm.py [--rounds 30] [--runs 3]

Each round times, in alternating order, one ``notebook_launcher`` call of a 2-rank function
that does one ``all_reduce`` and returns its rank: cold (``start_method`` fork, the default:
workers started and stopped by the call) and warm (``reuse_workers=True`` on workers the first
warm call started, outside the timing); then warm calls back to back, without a cold fork
between them (a fork leaves the kernel's pages copy-on-write, which slows the kernel for a
while after it). Then the same with a 400 MB kernel tensor passed as an
argument (warm only: the second and later calls against the first), and warm workers started
by spawn against a cold spawn launch (a few calls each). Each figure is the median
over rounds; ``--runs`` repeats the whole and gives each run's median, the table showing the
median of them with the lowest and highest run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

import nb_accel
from nb_accel import notebook_launcher

TARGET_MS = 3.0
TARGET_RATIO = 0.15


def reduce_once(*_tensors: torch.Tensor) -> int:
    """One all_reduce over the group; the rank."""
    total = torch.ones(1)
    dist.all_reduce(total)
    return dist.get_rank()


def _timed(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def one_run(rounds: int) -> dict[str, float]:
    """Median seconds of each contender over ``rounds`` alternating rounds."""
    cold = lambda: notebook_launcher(reduce_once, num_processes=2, show_progress=False)  # noqa: E731
    warm = lambda: notebook_launcher(  # noqa: E731
        reduce_once, num_processes=2, show_progress=False, reuse_workers=True
    )
    warm()  # the workers start here, outside the timing
    times: dict[str, list[float]] = {"cold": [], "warm": []}
    for index in range(rounds):
        order = [("cold", cold), ("warm", warm)]
        for name, call in order if index % 2 == 0 else order[::-1]:
            times[name].append(_timed(call))
    back_to_back = [_timed(warm) for _ in range(rounds)]  # no cold fork in between
    big = torch.zeros(100_000_000)  # 400 MB
    with_big = lambda: notebook_launcher(  # noqa: E731
        reduce_once, args=(big,), num_processes=2, show_progress=False, reuse_workers=True
    )
    first_big = _timed(with_big)
    again_big = [_timed(with_big) for _ in range(max(3, rounds // 5))]
    nb_accel.stop_workers()
    spawned = {"start_method": "spawn", "num_processes": 2, "show_progress": False}
    cold_spawn = [
        _timed(lambda: notebook_launcher(reduce_once, **spawned))  # type: ignore[arg-type]
        for _ in range(2)
    ]
    notebook_launcher(reduce_once, reuse_workers=True, **spawned)  # type: ignore[arg-type]
    warm_spawn = [
        _timed(lambda: notebook_launcher(reduce_once, reuse_workers=True, **spawned))  # type: ignore[arg-type]
        for _ in range(max(3, rounds // 3))
    ]
    nb_accel.stop_workers()
    return {
        "cold_spawn": statistics.median(cold_spawn),
        "warm_spawn": statistics.median(warm_spawn),
        "back_to_back": statistics.median(back_to_back),
        "cold": statistics.median(times["cold"]),
        "warm": statistics.median(times["warm"]),
        "ratio": statistics.median(
            w / c for w, c in zip(times["warm"], times["cold"], strict=True)
        ),
        "big_first": first_big,
        "big_again": statistics.median(again_big),
    }


def main() -> None:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--runs", type=int, default=3)
    options = parser.parse_args()
    runs = [one_run(options.rounds) for _ in range(options.runs)]

    def cell(key: str, scale: float = 1000.0) -> str:
        values = sorted(run[key] * scale for run in runs)
        return f"{statistics.median(values):9.3f}  [{values[0]:.3f}-{values[-1]:.3f}]"

    print(
        f"\nWarm workers, 2 CPU ranks (gloo, fork); {options.runs} runs of {options.rounds} "
        "alternating rounds; medians over the runs, [lowest-highest run]"
    )
    print(f"{'what':52} {'ms / ratio':>9}")
    print(f"{'cold launch (fork, the baseline)':52} {cell('cold')}")
    print(f"{'warm launch (reuse_workers=True)':52} {cell('warm')}")
    print(f"{'warm / cold, paired per round':52} {cell('ratio', 1.0)}")
    print(f"{'warm launch, back to back (no fork in between)':52} {cell('back_to_back')}")
    print(f"{'cold launch, spawn (the baseline)':52} {cell('cold_spawn')}")
    print(f"{'warm launch, workers started by spawn':52} {cell('warm_spawn')}")
    print(f"{'warm launch with a 400 MB tensor, first time':52} {cell('big_first')}")
    print(f"{'warm launch with the same 400 MB tensor, again':52} {cell('big_again')}")
    warm_ms = statistics.median(run["warm"] for run in runs) * 1000
    ratio = statistics.median(run["ratio"] for run in runs)
    verdict = "PASS" if warm_ms <= TARGET_MS and ratio <= TARGET_RATIO else "FAIL"
    print(
        f"target warm <= {TARGET_MS} ms and <= {TARGET_RATIO}x cold: {warm_ms:.3f} ms, "
        f"{ratio:.3f}x  {verdict}"
    )


if __name__ == "__main__":
    main()
