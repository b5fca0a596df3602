"""Colab's stack against the main one, in the same run: a launch, a warm launch, an empty cell.

Run from the repository root::

    .venv/bin/python benchmarks/stacks.py [--rounds 15]

One Jupyter kernel per stack: the main stack's (``.venv``: IPython 9, ipywidgets 8) and the
Colab-mirror lane's (``tools/lane_env.py colab``: IPython 7.34, ipywidgets 7.7.1, ipykernel 6.17,
jupyter_client 7.4.9, the same Python and torch). In each kernel, round after round, the stacks
taking turns, three cells are timed from the execute request to the kernel's reply:

- a cold launch, ``notebook_launcher(rank, num_processes=2)`` (the live view included);
- a warm launch, the same with ``reuse_workers=True`` (the workers kept from the first);
- the warm launch without the live view (``show_progress=False``): what the widgets cost;
- an empty ``%%distributed`` cell on the same 2 workers.

Printed: each stack's median and 10th-90th percentiles, and Colab's median over the main
stack's (the baseline). Expect the same within noise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from jupyter_client import KernelManager
from jupyter_client.blocking import BlockingKernelClient
from jupyter_client.kernelspec import KernelSpecManager
from machine import run_header
from magic import timed_cell

import nb_accel

ROOT = Path(__file__).resolve().parents[1]
SETUP = """
import torch.distributed as dist
from nb_accel import notebook_launcher
def rank():
    return dist.get_rank()
%load_ext nb_accel
"""
CELLS = {
    "cold launch": "notebook_launcher(rank, num_processes=2);",
    "warm launch": "notebook_launcher(rank, num_processes=2, reuse_workers=True);",
    "warm, no view": "notebook_launcher(rank, num_processes=2, reuse_workers=True, "
    "show_progress=False);",
    "empty cell": "%%distributed\npass",
}


def _kernel(python: str, folder: Path, name: str) -> tuple[KernelManager, BlockingKernelClient]:
    spec = folder / name
    spec.mkdir(parents=True)
    argv = [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": name}))
    manager = KernelManager(
        kernel_name=name, kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(folder)])
    )
    manager.start_kernel()
    client = manager.client()
    client.start_channels()
    client.wait_for_ready(timeout=120)
    return manager, client


def _spread(values: list[float]) -> str:
    ordered = sorted(values)
    low, high = ordered[len(ordered) // 10], ordered[(len(ordered) * 9) // 10]
    return f"{statistics.median(values) * 1e3:9.1f} ({low * 1e3:.1f}-{high * 1e3:.1f})"


def main() -> None:
    """Run the rounds and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    lane = subprocess.run(
        ["python3", str(ROOT / "tools" / "lane_env.py"), "colab"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    pythons = {"main": sys.executable, "colab": os.path.join(lane, "bin", "python")}
    print(run_header(nb_accel=nb_accel.__version__))
    times: dict[str, dict[str, list[float]]] = {s: {c: [] for c in CELLS} for s in pythons}
    with tempfile.TemporaryDirectory(prefix="nb_accel-stacks-") as folder:
        kernels = {name: _kernel(python, Path(folder), name) for name, python in pythons.items()}
        try:
            for _, client in kernels.values():
                timed_cell(client, SETUP)
                for code in CELLS.values():  # the workers, imports and caches warmed up
                    timed_cell(client, code)
            for index in range(args.rounds):
                order = list(kernels) if index % 2 == 0 else list(kernels)[::-1]
                for stack in order:
                    for cell, code in CELLS.items():
                        times[stack][cell].append(timed_cell(kernels[stack][1], code, 300))
        finally:
            for manager, client in kernels.values():
                client.stop_channels()
                manager.shutdown_kernel(now=False)
    print(f"\n{args.rounds} rounds; ms, median (10th-90th percentile)")
    print(f"  {'cell':<14} {'main stack':>24} {'Colab stack':>24} {'Colab / main':>13}")
    for cell in CELLS:
        main_median = statistics.median(times["main"][cell])
        ratio = statistics.median(times["colab"][cell]) / main_median
        print(
            f"  {cell:<14} {_spread(times['main'][cell]):>24} "
            f"{_spread(times['colab'][cell]):>24} {ratio:13.2f}"
        )


if __name__ == "__main__":
    main()
