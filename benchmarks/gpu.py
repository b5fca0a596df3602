"""Launches on GPUs: nb_accel cold and warm against the bare floor, from the same run.

Run from the repository root on a machine with CUDA GPUs::

    .venv/bin/python benchmarks/gpu.py [--rounds 6] [--runs 2]

Each round times, in alternating order, one launch on every GPU of a function that sets its
device, does one NCCL ``all_reduce`` of a CUDA tensor and returns: the bare floor
(``torch.multiprocessing.start_processes`` with fork, each rank doing ``init_process_group`` /
``all_reduce`` / ``destroy_process_group`` itself), ``notebook_launcher`` (cold: workers started
and stopped by the call) and ``notebook_launcher(reuse_workers=True)`` on workers a first warm
call started outside the timing (the CUDA context and the NCCL communicator kept). The benchmark
process never initialises CUDA, as a notebook's kernel that launches on its GPUs does not.
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import statistics
import subprocess
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp

import nb_accel
from nb_accel import PartialState, notebook_launcher
from nb_accel.runtime.device_types import cuda_facts


def reduce_on_gpu() -> float:
    """One NCCL all_reduce of a CUDA tensor on this rank's GPU; its value."""
    value = torch.ones(1024, device=PartialState().device)
    dist.all_reduce(value)
    return value[0].item()


def _bare_rank(index: int, world: int, port: int) -> None:
    torch.cuda.set_device(index)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=index, world_size=world
    )
    value = torch.ones(1024, device=f"cuda:{index}")
    dist.all_reduce(value)
    value[0].item()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _timed(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def one_run(rounds: int, count: int) -> dict[str, list[float]]:
    """Seconds of each contender in each of ``rounds`` rounds, the order rotating."""
    bare = lambda: torch_mp.start_processes(  # noqa: E731
        _bare_rank, args=(count, _free_port()), nprocs=count, start_method="fork"
    )
    cold = lambda: notebook_launcher(reduce_on_gpu, num_processes=count, show_progress=False)  # noqa: E731
    warm = lambda: notebook_launcher(  # noqa: E731
        reduce_on_gpu, num_processes=count, show_progress=False, reuse_workers=True
    )
    contenders = [("bare", bare), ("cold", cold), ("warm", warm)]
    warm()  # the warm workers start here, outside the timing
    times: dict[str, list[float]] = {name: [] for name, _ in contenders}
    for index in range(rounds):
        shift = index % len(contenders)
        for name, call in contenders[shift:] + contenders[:shift]:
            times[name].append(_timed(call))
    nb_accel.stop_workers()
    return times


def main() -> None:
    """Run the rounds ``--runs`` times; print each figure's median and its runs' spread."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--runs", type=int, default=2)
    options = parser.parse_args()
    count = cuda_facts.cuda_device_count()
    if count == 0:
        raise SystemExit("benchmarks/gpu.py needs a CUDA GPU; this machine has none")
    listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    name = listing.stdout.splitlines()[0].split(" (UUID")[0] if listing.stdout else "GPU"
    print(
        f"{count} x {name}; {os.cpu_count()} CPU cores; Python {platform.python_version()}, "
        f"torch {torch.__version__}, nb_accel {nb_accel.__version__}"
    )
    medians: dict[str, list[float]] = {}
    for run in range(options.runs):
        times = one_run(options.rounds, count)
        figures = {name: statistics.median(values) for name, values in times.items()}
        figures["cold/bare"] = statistics.median(
            c / b for c, b in zip(times["cold"], times["bare"], strict=True)
        )
        figures["warm/bare"] = statistics.median(
            w / b for w, b in zip(times["warm"], times["bare"], strict=True)
        )
        for key, value in figures.items():
            medians.setdefault(key, []).append(value)
        print(f"run {run + 1}: " + ", ".join(f"{k} {v:.4g}" for k, v in figures.items()))
    print("| figure | median of runs | lowest-highest run |")
    print("| --- | --- | --- |")
    for key, values in medians.items():
        unit = "" if "/" in key else " s"
        print(
            f"| {key} | {statistics.median(values):.4g}{unit} | "
            f"{min(values):.4g}-{max(values):.4g}{unit} |"
        )


if __name__ == "__main__":
    main()
