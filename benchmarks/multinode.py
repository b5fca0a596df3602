"""Multi-node benchmark: two "nodes" on this machine, 2 workers each, against torchrun.

Run from the repository root::

    .venv/bin/python benchmarks/multinode.py            # or: make bench

Both contenders use torch's elastic agent and c10d rendezvous on 127.0.0.1; each round starts two
node processes at once and times until both have exited (interpreter start and imports
included, which both pay alike):

- torchrun (baseline): ``python -m torch.distributed.run --nnodes 2 --nproc-per-node 2
  --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT --node-rank K`` on a script whose ranks
  join the group from the environment, all-reduce one tensor, and leave.
- nb_accel: ``notebook_launcher(fn, num_processes=2, num_nodes=2, node_rank=K,
  rdzv_endpoint="127.0.0.1:PORT")`` with a function that all-reduces one tensor.

Contenders alternate within every round (the order flips every other round); medians are
reported with the ratio to torchrun's.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from machine import run_header

import nb_accel

TORCHRUN_SCRIPT = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
assert t.item() == dist.get_world_size()
dist.destroy_process_group()
"""

NB_ACCEL_SCRIPT = """
import sys
import torch, torch.distributed as dist
import nb_accel

def work():
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()

out = nb_accel.notebook_launcher(work, num_processes=2, num_nodes=2, node_rank=int(sys.argv[1]),
                                 rdzv_endpoint=sys.argv[2], show_progress=False)
assert out == [4.0, 4.0], out
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _two_nodes(commands: list[list[str]]) -> float:
    """Start both node commands at once; seconds until both have exited successfully."""
    started = time.perf_counter()
    nodes = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for command in commands
    ]
    outputs = [node.communicate(timeout=120)[0] for node in nodes]
    elapsed = time.perf_counter() - started
    for node, output in zip(nodes, outputs, strict=True):
        if node.returncode != 0:
            raise RuntimeError(f"a node failed:\n{output.decode(errors='replace')}")
    return elapsed


def torchrun_round(script: Path) -> float:
    """One two-node torchrun launch."""
    endpoint = f"127.0.0.1:{_free_port()}"
    base = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2"]
    base += ["--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint]
    return _two_nodes([[*base, "--node-rank", str(k), str(script)] for k in (0, 1)])


def nb_accel_round(script: Path) -> float:
    """One two-node nb_accel launch."""
    endpoint = f"127.0.0.1:{_free_port()}"
    return _two_nodes([[sys.executable, str(script), str(k), endpoint] for k in (0, 1)])


def main(argv: list[str] | None = None) -> None:
    """Time both contenders and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8, help="timed rounds")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    args = parser.parse_args(argv)
    print(run_header(torch=torch.__version__, nb_accel=nb_accel.__version__))
    with tempfile.TemporaryDirectory() as folder:
        torchrun_script = Path(folder, "torchrun_node.py")
        torchrun_script.write_text(TORCHRUN_SCRIPT)
        nb_script = Path(folder, "nb_accel_node.py")
        nb_script.write_text(NB_ACCEL_SCRIPT)
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        contenders = {
            "torchrun (c10d)": lambda: torchrun_round(torchrun_script),
            "nb_accel.notebook_launcher": lambda: nb_accel_round(nb_script),
        }
        times: dict[str, list[float]] = {name: [] for name in contenders}
        for number in range(args.warmup + args.rounds):
            order = list(contenders) if number % 2 == 0 else list(reversed(contenders))
            for name in order:
                elapsed = contenders[name]()
                if number >= args.warmup:
                    times[name].append(elapsed)
    base = statistics.median(times["torchrun (c10d)"])
    print(
        f"Two nodes x 2 workers on 127.0.0.1, all-reduce, until both nodes exit "
        f"({args.rounds} rounds, alternating)"
    )
    print(f"{'contender':34s} {'median s':>9s} {'max s':>7s}  vs torchrun")
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"{name:34s} {median:9.2f} {max(samples):7.2f}  {median / base:9.2f}x")


if __name__ == "__main__":
    main()
