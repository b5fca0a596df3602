"""A cold fork launch whose ranks prepare a model, with the kernel sharing what ``prepare()``
imports (``nb_accel.launch.processes.SHARED_IMPORTS``, imported once before the first fork)
against the same launch with nothing shared (each rank importing it on every launch).

Each round runs both contenders, each in a fresh interpreter (the kernel), in alternating
order: 4 launches of 2 ranks, each rank preparing a ``Linear(4, 1)`` with DDP and taking three
steps. The first launch of a kernel pays the import (in the kernel, or in every rank); the
table gives the first launch and the median of the later ones, per contender, with the spread
over rounds.

Run from the repository root::

    .venv/bin/python benchmarks/prepare_launch.py --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

#: The kernel of one contender: ``sys.argv[1]`` says whether to share the imports.
KERNEL = """
import json, sys, time
import torch
import nb_accel.launch.processes as processes
from nb_accel import Accelerator, notebook_launcher

if sys.argv[1] == "none":
    processes.SHARED_IMPORTS = ()

def train():
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    for _ in range(3):
        accelerator.backward(model(torch.ones(4, 4)).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()
    return accelerator.process_index

if __name__ == "__main__":
    took = []
    for _ in range(4):
        started = time.perf_counter()
        notebook_launcher(train, num_processes=2, start_method="fork")
        took.append(time.perf_counter() - started)
    print(json.dumps(took))
"""

CONTENDERS = ("shared", "none")


def one_kernel(contender: str) -> list[float]:
    """The launch times of one fresh kernel of ``contender``."""
    done = subprocess.run(
        [sys.executable, "-c", KERNEL, contender], capture_output=True, text=True, check=True
    )
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    """Run the rounds and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    first: dict[str, list[float]] = {c: [] for c in CONTENDERS}
    later: dict[str, list[float]] = {c: [] for c in CONTENDERS}
    for index in range(args.rounds):
        for contender in CONTENDERS if index % 2 == 0 else CONTENDERS[::-1]:
            took = one_kernel(contender)
            first[contender].append(took[0])
            later[contender].append(statistics.median(took[1:]))
    print(f"{args.rounds} rounds, 2 ranks, fork; seconds (median over rounds, min-max)")
    print(f"{'contender':<10}{'first launch':>22}{'later launches':>24}")
    for contender in CONTENDERS:
        cells = []
        for samples in (first[contender], later[contender]):
            cells.append(
                f"{statistics.median(samples):.3f} ({min(samples):.3f}-{max(samples):.3f})"
            )
        print(f"{contender:<10}{cells[0]:>22}{cells[1]:>24}")
    ratio = statistics.median(later["shared"]) / statistics.median(later["none"])
    print(f"later launches, shared / none: {ratio:.3f}x")


if __name__ == "__main__":
    main()
