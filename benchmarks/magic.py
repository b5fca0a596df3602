"""%%distributed benchmark: round trip of an empty cell on 2 workers, through a real kernel.

Run from the repository root::

    .venv/bin/python benchmarks/magic.py            # or: make bench

A Jupyter kernel is started with jupyter_client; ``%load_ext nb_accel`` and a first
``%%distributed -n 2`` cell start the pool. Then, alternating, an empty plain cell (``pass``,
the baseline) and an empty ``%%distributed`` cell (``pass`` on both ranks) are executed and
timed from the execute request to the kernel's reply. The overhead is the difference of the
medians (and of the 95th percentiles). Targets: ≤ 2 ms median, ≤ 10 ms p95.

Inside the kernel, the same empty ``%%distributed`` cell is then run by IPython's
``run_cell_magic`` and timed there (the magic's own time, without Jupyter's messages), beside
its floor: the pool's ``execute("pass")``, one command to the same workers.

Then the same again under load: one busy-looping process per CPU core runs while the cells
are timed (``--no-load`` skips this second table).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import statistics
import time
from collections.abc import Iterator
from typing import Any

from jupyter_client import KernelManager
from jupyter_client.blocking import BlockingKernelClient
from machine import run_header

import nb_accel

MEDIAN_TARGET_MS = 2.0
P95_TARGET_MS = 10.0


def timed_cell(client: BlockingKernelClient, code: str, timeout_s: float = 60) -> float:
    """Seconds from sending ``code`` to the kernel's execute reply (which must be ok)."""
    start = time.perf_counter()
    msg_id = client.execute(code, store_history=False)
    while True:
        reply = client.get_shell_msg(timeout=timeout_s)
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    elapsed = time.perf_counter() - start
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"{code!r} failed: {reply['content'].get('evalue')}")
    return elapsed


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def _spin() -> None:
    while True:
        pass


@contextlib.contextmanager
def busy_cores(count: int) -> Iterator[None]:
    """``count`` processes that keep a CPU core busy each, while the block runs."""
    context = multiprocessing.get_context("spawn")
    spinners = [context.Process(target=_spin, daemon=True) for _ in range(count)]
    for spinner in spinners:
        spinner.start()
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.terminate()
        for spinner in spinners:
            spinner.join()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200, help="timed cells of each kind")
    parser.add_argument("--warmup", type=int, default=20, help="untimed rounds first")
    parser.add_argument("--no-load", action="store_true", help="skip the table under load")
    return parser.parse_args(argv)


def measure(client: BlockingKernelClient, args: argparse.Namespace) -> dict[str, list[float]]:
    """Alternating plain and ``%%distributed`` cells: their round trips, warm-up left out."""
    cells = {"plain cell": "pass", "%%distributed cell": "%%distributed\npass"}
    times: dict[str, list[float]] = {name: [] for name in cells}
    for index in range(args.warmup + args.rounds):
        order = list(cells) if index % 2 == 0 else list(cells)[::-1]
        for name in order:
            seconds = timed_cell(client, cells[name])
            if index >= args.warmup:
                times[name].append(seconds)
    return times


#: Run in the kernel: the magic's own time per empty cell, and its floor, as JSON on stdout.
_INSIDE = """
import json as _json, time as _time
from nb_accel.launch.warm.kept import kept_pool as _kept_pool
def _timed(call, rounds):
    seconds = []
    for _ in range(rounds):
        start = _time.perf_counter()
        call()
        seconds.append(_time.perf_counter() - start)
    return seconds
_ip = get_ipython()
_magic = lambda: _ip.run_cell_magic("distributed", "", "pass")
_floor = lambda: _kept_pool().execute("pass")
_times = {}
for _ in range({rounds}):
    for _name, _call in (
        ("%%distributed magic, in the kernel", _magic),
        ("  floor: pool.execute, in the kernel", _floor),
    ):
        _times.setdefault(_name, []).extend(_timed(_call, 1))
print(_json.dumps(_times))
"""


def inside_kernel(client: BlockingKernelClient, rounds: int) -> dict[str, list[float]]:
    """The magic's own time per empty cell inside the kernel, and its floor (alternating)."""
    printed: list[str] = []

    def keep(message: dict[str, Any]) -> None:
        if message["msg_type"] == "stream":
            printed.append(message["content"]["text"])

    reply = client.execute_interactive(
        _INSIDE.replace("{rounds}", str(rounds)), output_hook=keep, timeout=600
    )
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"the timing cell failed: {reply['content'].get('evalue')}")
    times: dict[str, list[float]] = json.loads("".join(printed).strip().splitlines()[-1])
    return times


def print_inside(times: dict[str, list[float]]) -> None:
    """The in-kernel medians and 95th percentiles."""
    print("\nThe same empty cell inside the kernel (run_cell_magic; no Jupyter messages)")
    print(f"  {'what':<38} {'median ms':>10} {'p95 ms':>8}")
    for name, values in times.items():
        median, p95 = statistics.median(values) * 1e3, _percentile(values, 0.95) * 1e3
        print(f"  {name:<38} {median:10.3f} {p95:8.3f}")


def print_table(title: str, times: dict[str, list[float]]) -> None:
    """The medians and 95th percentiles, the overhead and the targets."""
    print(f"\n{title}")
    print(f"  {'cell':<22} {'median ms':>10} {'p95 ms':>8}")
    stats = {}
    for name, values in times.items():
        stats[name] = (statistics.median(values) * 1e3, _percentile(values, 0.95) * 1e3)
        print(f"  {name:<22} {stats[name][0]:10.2f} {stats[name][1]:8.2f}")
    median = stats["%%distributed cell"][0] - stats["plain cell"][0]
    p95 = stats["%%distributed cell"][1] - stats["plain cell"][1]
    ok = median <= MEDIAN_TARGET_MS and p95 <= P95_TARGET_MS
    print(
        f"  overhead: {median:.2f} ms median, {p95:.2f} ms p95 (targets <= {MEDIAN_TARGET_MS} "
        f"ms, <= {P95_TARGET_MS} ms): {'PASS' if ok else 'MISS'}"
    )


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print the tables."""
    args = parse_args(argv)
    print(run_header(nb_accel=nb_accel.__version__))
    manager = KernelManager(kernel_name="python3")
    manager.start_kernel()
    client = manager.client()
    client.start_channels()
    cores = os.cpu_count() or 1
    try:
        client.wait_for_ready(timeout=60)
        timed_cell(client, "%load_ext nb_accel")
        timed_cell(client, "%%distributed -n 2\npass")
        quiet = measure(client, args)
        inside = inside_kernel(client, args.rounds)
        loaded = None
        if not args.no_load:
            with busy_cores(cores):
                loaded = measure(client, args)
        timed_cell(client, "%distributed stop")
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    rounds = f"{args.rounds} rounds after {args.warmup} warm-up rounds, alternating"
    print_table(f"Empty cell round trip through a kernel, 2 workers; {rounds}", quiet)
    print_inside(inside)
    if loaded is not None:
        print_table(f"The same with a busy-looping process on each of the {cores} cores", loaded)


if __name__ == "__main__":
    main()
