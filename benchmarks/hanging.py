"""How fast a `%%distributed` pool gets out of a hang: a failing rank, an interrupt, stacks.

Run from the repository root: ``.venv/bin/python benchmarks/hanging.py``. A two-rank CPU pool
(gloo) runs, alternating within each round, a cell that sums with ``all_reduce`` (the baseline)
and the same cell whose rank 1 raises first (rank 0 then waits in the collective for it). The
failing cell is timed until the kernel raises; the next cell (which rebuilds the process group)
is timed too. Then rank 1 waits in a receive while rank 0 sleeps, the kernel is interrupted,
and the time from the signal to ``KeyboardInterrupt`` is taken. Then an 8-rank pool's stacks
and last collectives are taken (``%distributed where``), and an empty cell's time gives the
normal path's cost. Last, the cost of torch's flight recorder (on in every worker): two pools
at once, one with it turned off (``TORCH_FR_BUFFER_SIZE=0``, the baseline), alternately run a
cell of 500 small all-reduces.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import threading
import time
from collections.abc import Callable

from nb_accel.launch.pool import WorkerPool
from nb_accel.worker.reporting.collective_trail import FLIGHT_RECORDER_ENV

SUM = "x = torch.ones(1)\ndist.all_reduce(x)"
FAILING = "x = torch.ones(1)\nif rank == 1:\n    raise ValueError('bad')\ndist.all_reduce(x)"
MANY = "for _ in range(500):\n    dist.all_reduce(torch.ones(4))"
STUCK = (
    "import time\nif rank == 1:\n    dist.recv(torch.zeros(1), src=0)\n"
    "else:\n    open(marker, 'w').close()\n    time.sleep(60)"
)


def _timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    try:
        action()
    except (ValueError, KeyboardInterrupt):
        pass
    return time.perf_counter() - started


def _interrupt_after(marker: str, sent: list[float]) -> None:
    while not os.path.exists(marker):
        time.sleep(0.005)
    time.sleep(0.2)  # rank 1 is in its receive by now
    sent.append(time.perf_counter())
    os.kill(os.getpid(), signal.SIGINT)


def _interrupt(pool: WorkerPool, folder: str, index: int) -> float:
    """Seconds from the interrupt to ``KeyboardInterrupt`` in the kernel."""
    marker = os.path.join(folder, f"waiting-{index}")
    sent: list[float] = []
    thread = threading.Thread(target=_interrupt_after, args=(marker, sent))
    pool.push({"marker": marker})
    thread.start()
    try:
        pool.execute(STUCK)
    except KeyboardInterrupt:
        ended = time.perf_counter()
    thread.join()
    return ended - sent[0]


def _recorder_cost(rounds: int) -> tuple[float, float]:
    """Seconds per all-reduce with the flight recorder off (baseline) and on."""
    pools: dict[bool, WorkerPool] = {}
    try:
        for recording in (False, True):
            if not recording:
                os.environ[FLIGHT_RECORDER_ENV] = "0"  # the workers keep the user's choice
            pools[recording] = WorkerPool(2, cpu=True)
            pools[recording].start()
            os.environ.pop(FLIGHT_RECORDER_ENV, None)
            pools[recording].execute("import torch, torch.distributed as dist")
        times: dict[bool, list[float]] = {False: [], True: []}
        for index in range(rounds):
            for recording in (False, True) if index % 2 == 0 else (True, False):
                times[recording].append(_timed(lambda p=pools[recording]: p.execute(MANY)) / 500)
        return statistics.median(times[False]), statistics.median(times[True])
    finally:
        for pool in pools.values():
            pool.stop(graceful=False)


def main() -> None:
    """Measure and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    folder = os.path.abspath("build/hanging")
    os.makedirs(folder, exist_ok=True)
    pool = WorkerPool(2, cpu=True)
    pool.start()
    try:
        pool.execute("import torch, torch.distributed as dist")
        normal, failing, after, interrupts = [], [], [], []
        for index in range(args.rounds):
            cases = [("normal", SUM), ("failing", FAILING)]
            for name, code in cases if index % 2 == 0 else reversed(cases):
                seconds = _timed(lambda code=code: pool.execute(code))
                (normal if name == "normal" else failing).append(seconds)
                if name == "failing":
                    after.append(_timed(lambda: pool.execute(SUM)))
            interrupts.append(_interrupt(pool, folder, index))
            pool.execute(SUM)  # settled again
        empty_two = statistics.median(_timed(lambda: pool.execute("pass")) for _ in range(20))
    finally:
        pool.stop(graceful=False)
    wide = WorkerPool(8, cpu=True)
    wide.start()
    try:
        where_many = hasattr(wide, "where")
        stacks = [_timed(wide.where) for _ in range(args.rounds)] if where_many else []
        empty_eight = statistics.median(_timed(lambda: wide.execute("pass")) for _ in range(20))
    finally:
        wide.stop(graceful=False)
    off, on = _recorder_cost(args.rounds * 4)
    print(f"\n%%distributed out of a hang; CPU pool (gloo); {args.rounds} rounds, medians")
    print(f"{'what':<62}  {'seconds':>8}  target")
    rows = [
        ("a cell that sums with all_reduce (baseline)", statistics.median(normal), ""),
        ("the same cell, rank 1 raising first", statistics.median(failing), ""),
        (
            "  its end after the baseline's",
            statistics.median(failing) - statistics.median(normal),
            "<= 1 s",
        ),
        ("the next cell (makes a new process group)", statistics.median(after), ""),
        (
            "interrupt, rank 1 in a collective: signal to KeyboardInterrupt",
            statistics.median(interrupts),
            "<= 2 s",
        ),
        ("an empty cell, 2 ranks", empty_two, ""),
        ("an empty cell, 8 ranks", empty_eight, ""),
    ]
    if stacks:
        where = "8 ranks' stacks and last collectives (%distributed where)"
        rows.append((where, statistics.median(stacks), "<= 0.2 s"))
    rows += [
        ("an all_reduce of 4 floats, flight recorder off (baseline)", off, ""),
        ("the same, flight recorder on", on, f"{on / off:.2f}x"),
    ]
    for name, seconds, target in rows:
        print(f"{name:<62}  {seconds:8.4f}  {target}")


if __name__ == "__main__":
    main()
