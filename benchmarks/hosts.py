"""A launch over two SSH hosts from the kernel, against starting the same two nodes by hand.

Run as root from the repository root: ``.venv/bin/python benchmarks/hosts.py``. Two machines
are made as the tests make them (network namespaces on a bridge, each with a real OpenSSH
server). Each round, alternating the order, times until every rank's result is back:

- by hand (the baseline): ``ssh nodeK python node.py K host0:port`` for both hosts at once,
  each running the existing multi-node call (``notebook_launcher(fn, num_processes=2,
  num_nodes=2, node_rank=K, rdzv_endpoint=...)``);
- nb_accel: ``notebook_launcher(fn, num_processes=2, hosts=["node0", "node1"])`` in this
  process.

Then, from the kernel, the time until an exception raised at once on rank 3 is re-raised, until
rank 3 killed at once is reported, and from an interrupt to the launch's end with nothing left
on the hosts.

Last, a ``%%distributed`` pool spread over the two hosts (``WorkerPool(2, hosts=[...])``): how
long it takes to start, against starting a pool of four ranks on this machine, and what an
empty cell costs on it against the same cell on that pool (each baseline measured in the same
run, alternating). Every figure is the median over the rounds, with its spread.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "multiproc"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # system_features

from ssh_hosts import SshMachines

from nb_accel import notebook_launcher
from nb_accel.errors import WorkerDiedError
from nb_accel.launch.pool import WorkerPool

BY_HAND = """
import sys
from nb_accel import notebook_launcher

def summed():
    import torch, torch.distributed as dist
    value = torch.ones(1)
    dist.all_reduce(value)
    return value.item()

notebook_launcher(
    summed, num_processes=2, cpu=True, num_nodes=2, node_rank=int(sys.argv[1]),
    rdzv_endpoint=sys.argv[2], show_progress=False,
)
"""


def summed() -> float:
    import torch
    import torch.distributed as dist

    value = torch.ones(1)
    dist.all_reduce(value)
    return value.item()


def fails_at_once() -> None:
    import torch.distributed as dist

    if dist.get_rank() == 3:
        raise ValueError("rank 3")
    dist.barrier()


def killed_at_once() -> None:
    import os
    import signal

    import torch.distributed as dist

    if dist.get_rank() == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()


def waits(folder: str) -> None:
    import threading
    from pathlib import Path

    import torch.distributed as dist

    Path(folder, f"rank{dist.get_rank()}").touch()
    threading.Event().wait(600)


def _by_hand(machines: SshMachines, script: Path, port: int) -> float:
    endpoint = f"{machines.hosts[0].address}:{port}"
    started = time.perf_counter()
    ssh = ["ssh", "-F", str(machines.ssh_config)]
    nodes = [
        subprocess.Popen(
            [*ssh, host.name, sys.executable, str(script), str(index), endpoint],
            stdout=subprocess.DEVNULL,
        )
        for index, host in enumerate(machines.hosts)
    ]
    for node in nodes:
        if node.wait() != 0:
            raise RuntimeError("a node started by hand failed")
    return time.perf_counter() - started


def _from_kernel(machines: SshMachines, function: Callable[..., object], *args: object) -> float:
    started = time.perf_counter()
    try:
        notebook_launcher(
            function,
            args,
            num_processes=2,
            cpu=True,
            hosts=[host.name for host in machines.hosts],
            ssh_config=machines.ssh_config,
            show_progress=False,
        )
    except (ValueError, WorkerDiedError):
        pass
    return time.perf_counter() - started


def _interrupt(machines: SshMachines, folder: Path, round_: int) -> float:
    """Seconds from the interrupt to the launch's end, nothing being left on the hosts."""
    marks = folder / f"round{round_}"
    marks.mkdir()
    sent: list[float] = []

    def interrupt() -> None:
        while not all((marks / f"rank{rank}").exists() for rank in range(4)):
            time.sleep(0.01)
        sent.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=interrupt)
    thread.start()
    try:
        _from_kernel(machines, waits, str(marks))
    except KeyboardInterrupt:
        pass
    thread.join()
    if machines.processes():
        raise RuntimeError(f"left on the hosts: {machines.processes()}")
    return time.perf_counter() - sent[0]


def _empty_cells(pool: WorkerPool, count: int) -> float:
    """The median seconds of ``count`` empty cells on ``pool``."""
    times = []
    for _ in range(count):
        started = time.perf_counter()
        pool.execute("pass")
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _started(pool: WorkerPool) -> float:
    """Seconds to start ``pool`` (until every rank has its process group and namespace)."""
    started = time.perf_counter()
    pool.start()
    return time.perf_counter() - started


def _pools(machines: SshMachines, rounds: int, cells: int) -> dict[str, list[float]]:
    """Per round, alternating: the start of a pool across the hosts and of a pool of four ranks
    here, and an empty cell's median on each."""
    found: dict[str, list[float]] = {"start there": [], "start here": [], "there": [], "here": []}
    for index in range(rounds):
        spread = WorkerPool(2, cpu=True, hosts=["node0", "node1"], ssh_config=machines.ssh_config)
        local = WorkerPool(4, cpu=True, hosts="local")  # whatever hosts are saved
        pools = [("there", spread), ("here", local)]
        try:
            for where, pool in pools if index % 2 == 0 else pools[::-1]:
                found[f"start {where}"].append(_started(pool))
            for where, pool in pools if index % 2 == 0 else pools[::-1]:
                found[where].append(_empty_cells(pool, cells))
        finally:
            spread.stop()
            local.stop()
    return found


def _row(name: str, values: list[float], baseline: list[float] | None, scale: float = 1) -> str:
    """A table row: the median, the spread over rounds, and the median against ``baseline``'s."""
    median = statistics.median(values)
    ratio = f"{median / statistics.median(baseline):.2f}x" if baseline else ""
    spread = f"{min(values) * scale:.3f}-{max(values) * scale:.3f}"
    return f"{name:<58}  {median * scale:8.3f}  {spread:>15}  {ratio}"


def main() -> None:
    """Measure and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cells", type=int, default=50)
    args = parser.parse_args()
    cleanups: list[Callable[[], None]] = []
    with tempfile.TemporaryDirectory() as folder:
        try:
            machines = SshMachines(Path(folder), cleanups.append)
            script = Path(folder) / "node.py"
            script.write_text(BY_HAND)
            _from_kernel(machines, summed)  # warm-up: the page cache, the hosts' keys
            hand, kernel, failing, killed, interrupts = [], [], [], [], []
            for index in range(args.rounds):
                order = [True, False] if index % 2 == 0 else [False, True]
                for manual in order:
                    if manual:
                        hand.append(_by_hand(machines, script, 29600 + index))
                    else:
                        kernel.append(_from_kernel(machines, summed))
                failing.append(_from_kernel(machines, fails_at_once))
                killed.append(_from_kernel(machines, killed_at_once))
                interrupts.append(_interrupt(machines, Path(folder), index))
            pools = _pools(machines, args.rounds, args.cells)
        finally:
            for cleanup in reversed(cleanups):
                cleanup()
    print(f"\nTwo SSH hosts, 2 CPU ranks each; {args.rounds} rounds, medians and spreads")
    print(f"{'what':<58}  {'seconds':>8}  {'lowest-highest':>15}  vs baseline")
    print(_row("by hand: ssh to each host, multi-node call (baseline)", hand, hand))
    print(_row("nb_accel: notebook_launcher(hosts=[node0, node1])", kernel, hand))
    print(_row("nb_accel: rank 3 raises at once, until re-raised", failing, None))
    print(_row("nb_accel: rank 3 killed (SIGKILL), until its error", killed, None))
    print(_row("interrupt to the launch's end, nothing left on the hosts", interrupts, None))
    here, there = pools["start here"], pools["start there"]
    print(_row("%%distributed pool of 4 ranks on this machine: start (baseline)", here, here))
    print(_row("%%distributed pool of 2 + 2 ranks on both hosts: start", there, here))
    print(f"\nAn empty %%distributed cell, median of {args.cells} per round, milliseconds")
    print(_row("pool of 4 ranks on this machine (baseline)", pools["here"], pools["here"], 1e3))
    print(_row("pool of 2 + 2 ranks on two SSH hosts", pools["there"], pools["here"], 1e3))


if __name__ == "__main__":
    main()
