"""A rank late in its own code: how long each way of running ranks takes to the error.

Rank 1 sleeps (its own code, not a collective) while rank 0 waits for it in ``all_reduce``
with a collective timeout of ``--timeout`` seconds. A cold launch, a warm launch
(``reuse_workers=True``), a cell of a persistent pool (``WorkerPool.execute``, what a
``%%distributed`` cell runs) and a launch under torch's elastic agent (``max_restarts=1``: the
group runs twice, so its target is twice the others') each end with a
``CollectiveTimeoutError``; the figure is the time from the call to the error, against the
timeout itself (the target: at most timeout + 2 s per attempt).
The sleep (``--sleep``) bounds the wait of a version that waits for the late rank's code to end.

Run from the repository root::

    .venv/bin/python benchmarks/late_rank.py --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from nb_accel import notebook_launcher, stop_workers
from nb_accel.errors import CollectiveTimeoutError
from nb_accel.launch.pool import WorkerPool


def late(sleep_s: float) -> None:
    """Rank 1 sleeps ``sleep_s``; rank 0 waits for it in a collective."""
    if dist.get_rank() == 1:
        time.sleep(sleep_s)
    dist.all_reduce(torch.ones(1))


CELL = """
import time, torch, torch.distributed as dist
if rank == 1:
    time.sleep({sleep_s})
dist.all_reduce(torch.ones(1))
"""


def _timed(call: object) -> float:
    started = time.perf_counter()
    try:
        call()  # type: ignore[operator]
    except CollectiveTimeoutError:
        return time.perf_counter() - started
    raise RuntimeError("the late rank's collective did not time out")


def main() -> None:
    """Measure each style ``--rounds`` times and print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=3.0, help="collective timeout, s")
    parser.add_argument("--sleep", type=float, default=15.0, help="the late rank's sleep, s")
    args = parser.parse_args()
    seen: dict[str, list[float]] = {
        "cold launch": [],
        "warm launch": [],
        "pool cell": [],
        "agent launch": [],
    }
    options = {"num_processes": 2, "timeout": args.timeout}
    notebook_launcher(dist.get_rank, reuse_workers=True, **options)  # starts the warm workers
    try:
        for _ in range(args.rounds):
            seen["cold launch"].append(
                _timed(lambda: notebook_launcher(late, args=(args.sleep,), **options))
            )
            seen["warm launch"].append(
                _timed(
                    lambda: notebook_launcher(
                        late, args=(args.sleep,), reuse_workers=True, **options
                    )
                )
            )
            seen["agent launch"].append(
                _timed(
                    lambda: notebook_launcher(late, args=(args.sleep,), max_restarts=1, **options)
                )
            )
    finally:
        stop_workers()
    pool = WorkerPool(2, cpu=True, timeout=args.timeout)
    pool.start()
    try:
        cell = CELL.format(sleep_s=args.sleep)
        for _ in range(args.rounds):
            seen["pool cell"].append(_timed(lambda: pool.execute(cell)))
    finally:
        pool.stop()
    print(f"timeout {args.timeout:g} s, late rank's sleep {args.sleep:g} s, {args.rounds} rounds")
    print(f"{'style':<12} {'median s':>9} {'min-max':>13} {'over timeout':>13}")
    for style, times in seen.items():
        median = statistics.median(times)
        attempts = 2 if style == "agent launch" else 1
        print(
            f"{style:<12} {median:9.2f} {min(times):6.2f}-{max(times):<6.2f} "
            f"{median - attempts * args.timeout:+12.2f}s"
        )


if __name__ == "__main__":
    main()
