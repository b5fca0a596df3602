"""What a launch costs when the function reaches big data of the kernel's, or returns some.

Run from the repository root: ``.venv/bin/python benchmarks/data.py`` (also part of
``make bench``); ``--sizes 40,400,4000`` for the scaling. Two processes, gloo. For each start
method (fork, spawn, forkserver) each round launches, alternating, a function that reaches
nothing (the baseline), one that reads a tensor held in a global, one that gets a NumPy array
as its argument, and one whose rank 0 returns a tensor; each function reads all of its data,
waits for the other rank, and reports its rank's private memory (psutil's USS) and how long
its own work took. A ``%%distributed`` pool then pushes an array (against pushing a number).
The table gives the median launch time, the time added against the baseline of the same
round less the function's own work (what moving the data costs), and the median private
memory per rank, added against the baseline.
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
import torch.distributed as dist

import nb_accel
from nb_accel.launch.pool import WorkerPool, load_value

#: The kernel's data, reached as a global by :func:`read_global`.
TENSOR = torch.empty(0)
#: Targets: (seconds added, MB of private memory added per rank) by start method.
TARGETS = {"fork": (0.05, 10.0), "spawn": (0.5, 20.0), "forkserver": (0.5, 20.0)}
#: Targets for a returned tensor and for a pool's push (seconds added), at 400 MB.
RESULT_TARGET_S, PUSH_TARGET_S = 0.3, 0.5

Report = tuple[float, float, Any]  # (private MB, seconds of the function's own work, value)


def _private_mb() -> float:
    return float(psutil.Process().memory_full_info().uss / 2**20)


def _report(started: float, value: Any = None) -> Report:
    took = time.perf_counter() - started
    dist.barrier()  # a page only one process has mapped yet counts as its private memory
    return _private_mb(), took, value


def read_nothing() -> Report:
    """The baseline."""
    return _report(time.perf_counter())


def read_global() -> Report:
    """Read the global tensor."""
    started = time.perf_counter()
    float(TENSOR.sum())
    return _report(started)


def read_argument(array: np.ndarray) -> Report:
    """Read the argument."""
    started = time.perf_counter()
    float(array.sum())
    return _report(started)


def return_tensor(count: int) -> Report:
    """Rank 0 returns a tensor of ``count`` float32 (making it is the function's work)."""
    started = time.perf_counter()
    value = torch.ones(count) if dist.get_rank() == 0 else None
    return _report(started, value)


Case = tuple[Callable[..., Report], tuple[Any, ...]]


def _timed(case: Case, start_method: str) -> tuple[float, float]:
    """The launch's time less the slowest rank's own work, and the largest private memory."""
    function, args = case
    started = time.perf_counter()
    reports = nb_accel.notebook_launcher(
        function, args=args, num_processes=2, start_method=start_method, show_progress=False
    )
    took = time.perf_counter() - started - max(seconds for _, seconds, _ in reports)
    return took, max(mb for mb, _, _ in reports)


def _launches(size_mb: int, start_method: str, rounds: int) -> dict[str, tuple[float, ...]]:
    """name -> (median launch s, median added s, median added MB per rank)."""
    global TENSOR  # noqa: PLW0603 - the launched function reaches it as a global
    count = size_mb * 2**20 // 4
    TENSOR = torch.ones(count)
    cases: dict[str, Case] = {
        "nothing": (read_nothing, ()),
        "tensor, global": (read_global, ()),
        "array, argument": (read_argument, (np.ones(count, dtype=np.float32),)),
        "tensor, returned": (return_tensor, (count,)),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    added: dict[str, list[float]] = {name: [] for name in cases}
    private: dict[str, list[float]] = {name: [] for name in cases}
    _timed(cases["nothing"], start_method)  # warm-up
    for index in range(rounds):
        order = list(cases) if index % 2 == 0 else list(reversed(cases))
        took = {name: _timed(cases[name], start_method) for name in order}
        for name, (seconds, mb) in took.items():
            times[name].append(seconds)
            added[name].append(seconds - took["nothing"][0])
            private[name].append(mb - took["nothing"][1])
    TENSOR = torch.empty(0)
    return {
        name: (
            statistics.median(times[name]),
            statistics.median(added[name]),
            statistics.median(private[name]),
        )
        for name in cases
    }


PRIVATE_MB = "import psutil\npsutil.Process().memory_full_info().uss / 2**20"
READ = "import torch.distributed as dist\nfloat(pushed.sum())\ndist.barrier()\n" + PRIVATE_MB


def _pushes(size_mb: int, rounds: int) -> tuple[float, float]:
    """A pool's push of an array: median seconds added against pushing a number, and the
    private memory per rank added once every rank has read it."""
    array = np.ones(size_mb * 2**20 // 4, dtype=np.float32)
    pool = WorkerPool(2, cpu=True)
    pool.start()
    try:
        added, private = [], []
        for _ in range(rounds):
            started = time.perf_counter()
            pool.push({"pushed": 1.0})
            small = time.perf_counter() - started
            before = pool.execute(PRIVATE_MB, want_value=True)
            started = time.perf_counter()
            pool.push({"pushed": array})
            added.append(time.perf_counter() - started - small)
            after = pool.execute(READ, want_value=True)
            private.append(
                max(load_value(after[r]) - load_value(before[r]) for r in range(pool.world_size))
            )
            pool.push({"pushed": None})
        return statistics.median(added), statistics.median(private)
    finally:
        pool.stop(graceful=False)


def main() -> None:
    """Measure and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", default="40,400", help="sizes in MB, comma-separated")
    parser.add_argument("--methods", default="fork,spawn,forkserver")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    methods = args.methods.split(",")
    print(
        f"\nBig data reached or returned by the launched function; 2 processes, gloo; "
        f"{args.rounds} rounds, cases alternating; added = against an empty launch of the same "
        "round, less the function's own work"
    )
    header = f"{'size':>7}  {'start':<10}  {'what':<17}  {'median s':>8}  {'added s':>7}"
    print(f"{header}  {'USS/rank added MB':>17}  target")
    for size_mb in sizes:
        for method in methods:
            rows = _launches(size_mb, method, args.rounds)
            for name, (seconds, extra_s, extra_mb) in rows.items():
                verdict, memory = "", f"{extra_mb:17.1f}"
                if name == "tensor, returned":  # rank 0 made it: its memory is its own
                    memory = f"{'-':>17}"
                if name != "nothing" and size_mb == 400:
                    limit_s, limit_mb = TARGETS[method]
                    if name == "tensor, returned":
                        limit_s, limit_mb = RESULT_TARGET_S, float("inf")
                    ok = extra_s <= limit_s and extra_mb <= limit_mb
                    verdict = f"<= {limit_s} s: {'PASS' if ok else 'FAIL'}"
                    if limit_mb != float("inf"):
                        verdict = f"<= {limit_s} s, {limit_mb:g} MB: {'PASS' if ok else 'FAIL'}"
                print(
                    f"{size_mb:>4} MB  {method:<10}  {name:<17}  {seconds:8.3f}  "
                    f"{extra_s:7.3f}  {memory}  {verdict}"
                )
        extra_s, extra_mb = _pushes(size_mb, args.rounds)
        verdict = ""
        if size_mb == 400:
            ok = extra_s <= PUSH_TARGET_S and extra_mb <= TARGETS["spawn"][1]
            verdict = (
                f"<= {PUSH_TARGET_S} s, {TARGETS['spawn'][1]:g} MB: {'PASS' if ok else 'FAIL'}"
            )
        print(
            f"{size_mb:>4} MB  {'pool':<10}  {'array, pushed':<17}  {'':>8}  {extra_s:7.3f}  "
            f"{extra_mb:17.1f}  {verdict}"
        )


if __name__ == "__main__":
    main()
