"""What a launch costs when the function reaches big data of the kernel's.

Run from the repository root: ``.venv/bin/python benchmarks/data.py`` (also part of
``make bench``). Two processes, fork, gloo. Each round launches, alternating, a function that
reaches nothing (the baseline), one that reads a 400 MB tensor held in a global, and one that
gets a 400 MB NumPy array as its argument; each function reads all of its data and reports its
rank's private memory (psutil's USS) and how long the reading took. The table gives the median
launch time, the time added against the empty launch of the same round less the reading (what
the launch itself adds), and the median private memory per rank.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import psutil
import torch

import nb_accel

SIZE_MB = 400
#: The kernel's data, reached as a global by :func:`read_global`.
TENSOR = torch.empty(0)
#: Targets under fork: time added and private memory per rank.
TARGET_S, TARGET_MB = 0.05, 10.0


def _private_mb() -> float:
    return float(psutil.Process().memory_full_info().uss / 2**20)


Report = tuple[float, float]  # (private MB, seconds spent reading)


def read_nothing() -> Report:
    """The baseline: this rank's private memory."""
    return _private_mb(), 0.0


def read_global() -> Report:
    """Read the global tensor; this rank's private memory and the reading's time."""
    started = time.perf_counter()
    float(TENSOR.sum())
    return _private_mb(), time.perf_counter() - started


def read_argument(array: np.ndarray) -> Report:
    """Read the argument; this rank's private memory and the reading's time."""
    started = time.perf_counter()
    float(array.sum())
    return _private_mb(), time.perf_counter() - started


def _timed(function: Callable[..., Report], args: tuple[Any, ...]) -> tuple[float, float]:
    """The launch's time less the slowest rank's reading, and the largest private memory."""
    started = time.perf_counter()
    reports = nb_accel.notebook_launcher(function, args=args, num_processes=2, show_progress=False)
    took = time.perf_counter() - started - max(seconds for _, seconds in reports)
    return took, max(mb for mb, _ in reports)


def main() -> None:
    """Measure and print the table."""
    global TENSOR  # noqa: PLW0603 - the launched function reaches it as a global
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    count = SIZE_MB * 2**20 // 4
    TENSOR = torch.ones(count)
    array = np.ones(count, dtype=np.float32)
    cases: dict[str, tuple[Callable[..., Report], tuple[Any, ...]]] = {
        "nothing": (read_nothing, ()),
        f"a {SIZE_MB} MB tensor, as a global": (read_global, ()),
        f"a {SIZE_MB} MB NumPy array, as an argument": (read_argument, (array,)),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    added: dict[str, list[float]] = {name: [] for name in cases}
    private: dict[str, list[float]] = {name: [] for name in cases}
    _timed(read_nothing, ())  # warm-up
    for index in range(args.rounds):
        order = list(cases) if index % 2 == 0 else list(reversed(cases))
        took = {name: _timed(*cases[name]) for name in order}
        for name, (seconds, mb) in took.items():
            times[name].append(seconds)
            added[name].append(seconds - took["nothing"][0])
            private[name].append(mb)
    print(
        f"\nBig data reached by the launched function; 2 processes, fork, gloo; {args.rounds} "
        "rounds, cases alternating"
    )
    width = max(len(name) for name in cases)
    print(
        f"{'what the function gets':<{width}}  {'median s':>8}  {'added s':>7}  {'USS/rank MB':>11}"
    )
    for name in cases:
        print(
            f"{name:<{width}}  {statistics.median(times[name]):8.3f}  "
            f"{statistics.median(added[name]):7.3f}  {statistics.median(private[name]):11.1f}"
        )
    for name in list(cases)[1:]:
        seconds = statistics.median(added[name])
        extra = statistics.median(private[name]) - statistics.median(private["nothing"])
        verdict = "PASS" if seconds <= TARGET_S and extra <= TARGET_MB else "FAIL"
        print(
            f"target {name}: <= {TARGET_S} s and <= {TARGET_MB:g} MB more per rank: "
            f"{seconds:.3f} s, {extra:+.1f} MB  {verdict}"
        )


if __name__ == "__main__":
    main()
