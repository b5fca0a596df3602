"""Warm workers: a repeat launch on them against a cold launch, from the same run.

Run from the repository root::

    .venv/bin/python benchmarks/warm.py [--rounds 30] [--runs 3]

Each round times, in alternating order, one ``notebook_launcher`` call of a 2-rank function
that does one ``all_reduce`` and returns its rank: cold (``start_method`` fork, the default:
workers started and stopped by the call) and warm (``reuse_workers=True`` on workers the first
warm call started, outside the timing); then warm calls back to back, without a cold fork
between them (a fork leaves the kernel's pages copy-on-write, which slows the kernel for a
while after it); then 30 warm launches, counting the kernel's descriptors and the workers'
memory before and after. Then a 400 MB kernel tensor passed as an argument: its first launch,
then rounds alternating the launch with it and the same launch without it (the paired
difference is what the unchanged tensor costs). Then warm workers started by spawn against a
cold spawn launch, and a ``--huge-gb`` tensor (4 GB) sent to warm spawned workers for the first
time, again, and to a cold spawn launch, against one bare ``pwrite`` of its bytes into
``/dev/shm`` timed just before (the floor of any copy into shared memory here; one untimed
before it, as a virtual machine's first touch of that much memory is slower). Each figure is
the median over rounds; ``--runs`` repeats the whole and gives each run's median, the table
showing the median of them with the lowest and highest run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import psutil
import torch
import torch.distributed as dist

import nb_accel
from nb_accel import notebook_launcher
from nb_accel.launch.warm.kept import kept_pool
from nb_accel.worker.transfer.segments import shared_root

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


def _bare_copy_s(tensor: torch.Tensor) -> float:
    """Seconds one ``pwrite`` of ``tensor``'s bytes into a new ``/dev/shm`` file takes: the
    floor of any copy into shared memory on this machine."""
    fd, path = tempfile.mkstemp(dir=shared_root())
    try:
        view = memoryview(tensor.numpy()).cast("B")
        start, written = time.perf_counter(), 0
        while written < view.nbytes:
            written += os.pwrite(fd, view[written:], written)
        return time.perf_counter() - start
    finally:
        os.close(fd)
        os.unlink(path)


def one_run(rounds: int, huge_gb: float) -> dict[str, float]:
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
    pool = kept_pool()
    assert pool is not None
    empty_command = [_timed(lambda: pool.execute("pass")) for _ in range(rounds)]
    kernel = psutil.Process()
    workers = kernel.children(recursive=True)
    fds, rss = kernel.num_fds(), sum(w.memory_info().rss for w in workers)
    for _ in range(30):
        warm()
    fds_grown = kernel.num_fds() - fds
    rss_grown = sum(w.memory_info().rss for w in workers) - rss
    big = torch.zeros(100_000_000)  # 400 MB
    with_big = lambda: notebook_launcher(  # noqa: E731
        reduce_once, args=(big,), num_processes=2, show_progress=False, reuse_workers=True
    )
    first_big = _timed(with_big)
    paired_big: dict[str, list[float]] = {"with": [], "without": []}
    for index in range(rounds):
        order = [("with", with_big), ("without", warm)]
        for name, call in order if index % 2 == 0 else order[::-1]:
            paired_big[name].append(_timed(call))
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
    figures = {
        "cold_spawn": statistics.median(cold_spawn),
        "warm_spawn": statistics.median(warm_spawn),
        "back_to_back": statistics.median(back_to_back),
        "empty_command": statistics.median(empty_command),
        "cold": statistics.median(times["cold"]),
        "warm": statistics.median(times["warm"]),
        "ratio": statistics.median(
            w / c for w, c in zip(times["warm"], times["cold"], strict=True)
        ),
        "big_first": first_big,
        "big_again": statistics.median(paired_big["with"]),
        "big_extra": statistics.median(
            a - b for a, b in zip(paired_big["with"], paired_big["without"], strict=True)
        ),
        "fds_grown": fds_grown,
        "rss_grown_mb": rss_grown / 2**20,
    }
    if huge_gb > 0:
        huge = torch.ones(int(huge_gb * 2**30) // 4)
        _bare_copy_s(huge)  # once untimed: the machine's first touch of that much memory
        figures["huge_bare_copy"] = _bare_copy_s(huge)
        figures["huge_warm"] = _timed(
            lambda: notebook_launcher(reduce_once, args=(huge,), reuse_workers=True, **spawned)  # type: ignore[arg-type]
        )
        figures["huge_warm_again"] = _timed(
            lambda: notebook_launcher(reduce_once, args=(huge,), reuse_workers=True, **spawned)  # type: ignore[arg-type]
        )
        nb_accel.stop_workers()
        figures["huge_cold_spawn"] = _timed(
            lambda: notebook_launcher(reduce_once, args=(huge,), **spawned)  # type: ignore[arg-type]
        )
        del huge
    nb_accel.stop_workers()
    return figures


def main() -> None:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--huge-gb", type=float, default=4.0, help="size of the big tensor sent once (0: none)"
    )
    options = parser.parse_args()
    runs = [one_run(options.rounds, options.huge_gb) for _ in range(options.runs)]

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
    print(f"{'  floor: an empty command to the same workers':52} {cell('empty_command')}")
    print(f"{'cold launch, spawn (the baseline)':52} {cell('cold_spawn')}")
    print(f"{'warm launch, workers started by spawn':52} {cell('warm_spawn')}")
    print(f"{'warm launch with a 400 MB tensor, first time':52} {cell('big_first')}")
    print(f"{'warm launch with the same 400 MB tensor, again':52} {cell('big_again')}")
    print(f"{'  its extra over the launch without it (paired)':52} {cell('big_extra')}")
    print(f"{'30 warm launches: kernel descriptors grown by':52} {cell('fds_grown', 1.0)}")
    print(f"{'30 warm launches: workers memory grown by (MB)':52} {cell('rss_grown_mb', 1.0)}")
    if "huge_warm" in runs[0]:
        gb = options.huge_gb
        print(f"{f'{gb:g} GB tensor to warm spawned workers, first time':52} {cell('huge_warm')}")
        print(f"{'  the same tensor again':52} {cell('huge_warm_again')}")
        print(f"{f'{gb:g} GB tensor, cold spawn launch':52} {cell('huge_cold_spawn')}")
        print(f"{'  floor: one pwrite of it into /dev/shm':52} {cell('huge_bare_copy')}")
    repeat_ms = statistics.median(run["back_to_back"] for run in runs) * 1000
    ratio = statistics.median(run["ratio"] for run in runs)
    verdict = "PASS" if repeat_ms <= TARGET_MS and ratio <= TARGET_RATIO else "FAIL"
    print(
        f"target: a repeat launch <= {TARGET_MS} ms (back to back: {repeat_ms:.3f} ms) and "
        f"<= {TARGET_RATIO}x a cold fork launch (paired: {ratio:.3f}x)  {verdict}"
    )
    extra_ms = statistics.median(run["big_extra"] for run in runs) * 1000
    verdict = "PASS" if extra_ms <= 10.0 else "FAIL"
    print(f"target: the unchanged 400 MB tensor again <= +10 ms: +{extra_ms:.3f} ms  {verdict}")


if __name__ == "__main__":
    main()
