"""A rank's debugger against IPython's own, in a real kernel driven through Jupyter's channels.

Run from the repository root::

    .venv/bin/python benchmarks/debugger.py [--rounds 20] [--runs 3]

In one kernel, each run makes three failures and opens ``%debug`` on each: an error raised in
the kernel itself (IPython's debugger: the baseline), a ``%%distributed`` cell that raised on
rank 1, and a cold ``notebook_launcher`` launch whose rank 1 raised (kept, paused, for it). For
each it times, on the client's clock, from sending ``%debug`` to the first prompt (the
``input_request`` on the stdin channel), then ``--rounds`` commands (``p value``) from the
answer to the next prompt; then ``q``. Figures are medians; ``--runs`` repeats the whole and
the table gives the median of the runs' medians with the lowest and highest run. Targets: the
first prompt within 1 s, a command's round trip within 50 ms.
"""

from __future__ import annotations

import argparse
import queue
import statistics
import time
from typing import Any

from jupyter_client import KernelManager
from jupyter_client.blocking import BlockingKernelClient

TARGET_FIRST_S = 1.0
TARGET_ROUND_TRIP_S = 0.050

SETUP = """
import nb_accel
import torch.distributed as dist
from nb_accel import notebook_launcher
%load_ext nb_accel

def kernel_side():
    value = 41
    raise ValueError("in the kernel")

def launched():
    value = 42 + dist.get_rank()
    if dist.get_rank() == 1:
        raise ValueError("on rank 1")
"""

FAILURES = {
    "IPython's %debug (kernel error, baseline)": "kernel_side()",
    "%%distributed cell, rank 1": (
        "%%distributed -n 2\nvalue = 42 + rank\nif rank == 1:\n    raise ValueError('cell')"
    ),
    "cold launch, rank 1 kept": "notebook_launcher(launched, num_processes=2)",
}


def _run(client: BlockingKernelClient, code: str) -> None:
    """Execute ``code`` and wait for its reply (its status is not checked: some fail)."""
    msg_id = client.execute(code, store_history=False, allow_stdin=False)
    while True:
        reply = client.get_shell_msg(timeout=120)
        if reply["parent_header"].get("msg_id") == msg_id:
            return


def _next_prompt(client: BlockingKernelClient, timeout: float = 60.0) -> dict[str, Any]:
    while True:
        message = client.get_stdin_msg(timeout=timeout)
        if message["msg_type"] == "input_request":
            return message


def _drain_until_reply(client: BlockingKernelClient, msg_id: str) -> None:
    while True:
        try:
            reply = client.get_shell_msg(timeout=60)
        except queue.Empty:
            return
        if reply["parent_header"].get("msg_id") == msg_id:
            return


def time_debugger(client: BlockingKernelClient, failure: str, rounds: int) -> tuple[float, float]:
    """Seconds to the first prompt, and the median round trip of a command."""
    _run(client, failure)
    start = time.perf_counter()
    msg_id = client.execute("%debug", store_history=False, allow_stdin=True)
    _next_prompt(client)
    first = time.perf_counter() - start
    trips = []
    for _ in range(rounds):
        sent = time.perf_counter()
        client.input("p value")
        _next_prompt(client)
        trips.append(time.perf_counter() - sent)
    client.input("q")
    _drain_until_reply(client, msg_id)
    return first, statistics.median(trips)


def main() -> None:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--runs", type=int, default=3)
    options = parser.parse_args()
    manager = KernelManager(kernel_name="python3")
    manager.start_kernel()
    client = manager.client()
    client.start_channels()
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in FAILURES}
    try:
        client.wait_for_ready(timeout=60)
        _run(client, SETUP)
        for _ in range(options.runs):
            for name, failure in FAILURES.items():
                figures[name].append(time_debugger(client, failure, options.rounds))
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=False)

    def cell(values: list[float]) -> str:
        ordered = sorted(value * 1000 for value in values)
        return f"{statistics.median(ordered):8.1f}  [{ordered[0]:.1f}-{ordered[-1]:.1f}]"

    print(
        f"\n%debug in a kernel, 2 CPU ranks; {options.runs} runs, {options.rounds} commands each;"
        " medians over the runs, [lowest-highest run], ms"
    )
    print(f"{'what':44} {'first prompt':>24} {'command round trip':>24}")
    for name, runs in figures.items():
        print(f"{name:44} {cell([r[0] for r in runs]):>24} {cell([r[1] for r in runs]):>24}")
    worst_first = max(statistics.median(r[0] for r in runs) for runs in figures.values())
    worst_trip = max(statistics.median(r[1] for r in runs) for runs in figures.values())
    verdict = (
        "PASS" if worst_first <= TARGET_FIRST_S and worst_trip <= TARGET_ROUND_TRIP_S else "FAIL"
    )
    print(
        f"target: first prompt <= {TARGET_FIRST_S:.0f} s, a command <= "
        f"{TARGET_ROUND_TRIP_S * 1000:.0f} ms: {worst_first * 1000:.1f} ms, "
        f"{worst_trip * 1000:.1f} ms  {verdict}"
    )


if __name__ == "__main__":
    main()
