"""Heavy output benchmark: 10,000 printed lines through a real kernel, nb_accel against the kernel.

Run from the repository root::

    .venv/bin/python benchmarks/output.py            # or: make bench
    .venv/bin/python benchmarks/output.py --browser  # also JupyterLab's draw time (see below)

A Jupyter kernel is started with jupyter_client, and each round runs these cells (order
reversed every other round):

- the baseline: the kernel prints the same 10,000 lines itself (``print`` in a loop, with the
  ``[rank N]`` prefixes nb_accel adds);
- nb_accel: ``notebook_launcher`` on 2 ranks, each printing 5,000 lines;
- nb_accel, a write per line: the same with the batching interval set to 0, so that every line
  is written and flushed as it arrives (what the launcher did before it batched output);
- nb_accel, silent: the same launch printing nothing (the launch's own cost).

For each cell: the ``stream`` messages and all iopub messages it produced, the kernel's CPU
time during the cell (the kernel process, all its threads; the workers are not counted) and
the wall time from the execute request to the kernel's idle status. nb_accel's output cost is
its kernel CPU time minus the silent launch's, as a ratio to the baseline's. Target: nb_accel
sends fewer than 100 stream messages.

``--browser`` also runs the cells in JupyterLab in headless Chromium (``make test-browser``
installs JupyterLab, Playwright and Debian's Chromium) and times each until the page shows
its last line and the cell is done (``output_browser.py``).
"""

from __future__ import annotations

import argparse
import queue
import statistics
import time
from dataclasses import dataclass

import psutil
from jupyter_client import KernelManager
from jupyter_client.blocking import BlockingKernelClient
from machine import run_header

import nb_accel

LINES = 10_000
RANKS = 2
CELL_TIMEOUT_S = 120.0
MESSAGE_TARGET = 100

SETUP = """
import nb_accel.launch.views.output as _output
from nb_accel import notebook_launcher

def _talk(lines):
    import torch.distributed as dist
    rank = dist.get_rank()
    for i in range(lines):
        print(f"line {i} of rank {rank}")
"""

CELLS = {
    "kernel prints (baseline)": (
        f"for r in range({RANKS}):\n    for i in range({LINES // RANKS}):\n"
        "        print(f'[rank {r}] line {i} of rank {r}')"
    ),
    "nb_accel": f"notebook_launcher(_talk, ({LINES // RANKS},), num_processes={RANKS});",
    "nb_accel, a write per line": (
        "_output.FLUSH_INTERVAL_S = 0.0\n"
        f"try:\n    notebook_launcher(_talk, ({LINES // RANKS},), num_processes={RANKS});\n"
        "finally:\n    _output.FLUSH_INTERVAL_S = 0.2"
    ),
    "nb_accel, silent": f"notebook_launcher(_talk, (0,), num_processes={RANKS});",
}


@dataclass
class CellCost:
    """What one cell cost."""

    streams: int
    messages: int
    cpu_s: float
    wall_s: float


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def run_cell(client: BlockingKernelClient, kernel: psutil.Process, code: str) -> CellCost:
    """Run ``code``; count its iopub messages and time it (it must succeed)."""
    cpu_before = _cpu(kernel)
    start = time.perf_counter()
    msg_id = client.execute(code, store_history=False)
    streams = messages = 0
    deadline = time.monotonic() + CELL_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            message = client.get_iopub_msg(timeout=1)
        except queue.Empty:
            continue
        if message["parent_header"].get("msg_id") != msg_id:
            continue
        messages += 1
        kind, content = message["msg_type"], message["content"]
        if kind == "stream":
            streams += 1
        elif kind == "error":
            raise RuntimeError(f"{code!r} failed: {content['evalue']}")
        elif kind == "status" and content["execution_state"] == "idle":
            break
    else:
        raise TimeoutError(f"{code!r} did not finish in {CELL_TIMEOUT_S} s")
    wall = time.perf_counter() - start
    return CellCost(streams, messages, _cpu(kernel) - cpu_before, wall)


def _kernel_pid(client: BlockingKernelClient) -> int:
    msg_id = client.execute("import os; os.getpid()", store_history=False)
    while True:
        message = client.get_iopub_msg(timeout=60)
        if message["parent_header"].get("msg_id") != msg_id:
            continue
        if message["msg_type"] == "execute_result":
            return int(message["content"]["data"]["text/plain"])


def kernel_costs(rounds: int) -> dict[str, list[CellCost]]:
    """Every cell's cost in each of ``rounds`` rounds (after one warm-up round)."""
    manager = KernelManager(kernel_name="python3")
    manager.start_kernel()
    client = manager.client()
    client.start_channels()
    costs: dict[str, list[CellCost]] = {name: [] for name in CELLS}
    try:
        client.wait_for_ready(timeout=60)
        kernel = psutil.Process(_kernel_pid(client))
        run_cell(client, kernel, SETUP)
        for index in range(rounds + 1):
            order = list(CELLS) if index % 2 == 0 else list(CELLS)[::-1]
            for name in order:
                cost = run_cell(client, kernel, CELLS[name])
                if index > 0:
                    costs[name].append(cost)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    return costs


def print_kernel_table(costs: dict[str, list[CellCost]], rounds: int) -> None:
    """The table, the ratios against the baseline and the targets."""
    print(
        f"\n{LINES:,} printed lines through a kernel ({RANKS} ranks x {LINES // RANKS:,} for "
        f"nb_accel); median of {rounds} rounds after 1 warm-up round, alternating"
    )
    print(
        f"  {'cell':<28} {'stream msgs':>11} {'iopub msgs':>10} {'kernel CPU s':>12} {'wall s':>7}"
    )
    medians = {}
    for name, values in costs.items():
        row = CellCost(
            round(statistics.median(v.streams for v in values)),
            round(statistics.median(v.messages for v in values)),
            statistics.median(v.cpu_s for v in values),
            statistics.median(v.wall_s for v in values),
        )
        medians[name] = row
        print(
            f"  {name:<28} {row.streams:>11} {row.messages:>10} {row.cpu_s:>12.3f} "
            f"{row.wall_s:>7.3f}"
        )
    base, ours, silent = (
        medians[n] for n in ("kernel prints (baseline)", "nb_accel", "nb_accel, silent")
    )
    output_cpu = max(0.0, ours.cpu_s - silent.cpu_s)
    ratio = output_cpu / base.cpu_s if base.cpu_s else float("inf")
    worst = max(v.streams for v in costs["nb_accel"])
    print(
        f"  nb_accel's output cost in kernel CPU (minus the silent launch): {output_cpu:.3f} s, "
        f"{ratio:.2f}x the baseline's"
    )
    print(
        f"  target: < {MESSAGE_TARGET} stream messages for nb_accel (most seen: {worst}): "
        f"{'PASS' if worst < MESSAGE_TARGET else 'MISS'}"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds")
    parser.add_argument("--browser", action="store_true", help="also time JupyterLab drawing")
    parser.add_argument("--browser-rounds", type=int, default=3, help="rounds in JupyterLab")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print the tables."""
    args = parse_args(argv)
    print(run_header(nb_accel=nb_accel.__version__))
    print_kernel_table(kernel_costs(args.rounds), args.rounds)
    if args.browser:
        from output_browser import print_browser_table

        print_browser_table(CELLS, SETUP, args.browser_rounds, LINES, RANKS)


if __name__ == "__main__":
    main()
