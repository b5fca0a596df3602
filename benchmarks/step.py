"""Training-step benchmark: a loop through ``nb_accel.Accelerator`` versus the same loop written
by hand with ``DistributedDataParallel`` (and Accelerate's ``Accelerator`` when installed).

Run from the repository root: ``.venv/bin/python benchmarks/step.py`` (also part of
``make bench``). Two worker processes (gloo, CPU); every contender trains its own copy of the
same MLP on the same data; contenders alternate in blocks of steps within one launch, and each
launch gives the median time per step (rank 0's wall clock, and each rank's CPU time), the
median over rounds of each round's ratio to the hand-written loop (paired), and the ratio of
the two medians. ``--runs`` launches are
made; the table gives each figure's median over them with its spread (lowest and highest run).
Each worker is pinned to one core to cut scheduling noise.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import nb_accel

BATCH, FEATURES, HIDDEN, CLASSES, SAMPLES = 64, 256, 512, 10, 8192
TARGET = 1.02

Step = Callable[[], None]


def make_model() -> torch.nn.Module:
    """The MLP every contender trains."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, CLASSES)
    )


def make_dataset() -> TensorDataset:
    """Random features and labels, the same on every rank."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, FEATURES, generator=generator)
    return TensorDataset(x, torch.randint(0, CLASSES, (SAMPLES,), generator=generator))


def endless(loader: DataLoader) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Batches forever, epoch after epoch."""
    epoch = 0
    while True:
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        elif isinstance(getattr(loader, "sampler", None), DistributedSampler):
            loader.sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def hand_written() -> Step:
    """DDP + DistributedSampler, the loop a PyTorch user writes by hand."""
    model = DistributedDataParallel(make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    dataset = make_dataset()
    batches = endless(DataLoader(dataset, batch_size=BATCH, sampler=DistributedSampler(dataset)))

    def step() -> None:
        x, y = next(batches)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    return step


def through(accelerator_class: type) -> Step:
    """The same loop through an Accelerator class (nb_accel's or Accelerate's)."""
    accelerator = accelerator_class()
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(make_dataset(), batch_size=BATCH, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    batches = endless(loader)

    def step() -> None:
        x, y = next(batches)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()

    return step


def contenders() -> dict[str, Step]:
    """Every contender's step function (built inside the worker)."""
    steps = {
        "hand-written DDP": hand_written(),
        "nb_accel.Accelerator": through(nb_accel.Accelerator),
    }
    try:
        os.environ["ACCELERATE_USE_CPU"] = "1"  # else Accelerate ignores the CPU process group
        import accelerate

        steps[f"accelerate {accelerate.__version__} Accelerator"] = through(accelerate.Accelerator)
    except Exception as exc:  # noqa: BLE001 - any failure only drops the optional row
        print(f"Accelerate skipped: {type(exc).__name__}: {exc}")
    return steps


def measure(rounds: int, block: int) -> dict[str, dict[str, list[float]]]:
    """Per-step seconds per contender, alternating in blocks (runs on every rank): ``wall``
    the wall-clock time, ``cpu`` this rank's CPU time (all its threads), which the other
    rank's share of the two cores disturbs less."""
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[dist.get_rank() % len(cores)]})
    steps = contenders()
    samples: dict[str, list[float]] = {name: [] for name in steps}
    cpu: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(3):  # warm-up
        for step in steps.values():
            step()
    for index in range(rounds):
        order = list(steps.items()) if index % 2 == 0 else list(steps.items())[::-1]
        for name, step in order:
            dist.barrier()
            start, start_cpu = time.perf_counter(), time.process_time()
            for _ in range(block):
                step()
            used = time.process_time() - start_cpu
            dist.barrier()
            samples[name].append((time.perf_counter() - start) / block)
            cpu[name].append(used / block)
    return {"wall": samples, "cpu": cpu}


def _ratios(samples: dict[str, list[float]]) -> dict[str, tuple[float, float, float]]:
    """Each contender's median seconds per step, its paired ratio to the hand-written loop
    (the median over rounds of each round's block against the hand-written block of the same
    round) and the ratio of the two medians."""
    base = samples["hand-written DDP"]
    found = {}
    for name, values in samples.items():
        # Each round's blocks ran back to back: pair them to cancel slow drifts of the machine.
        paired = statistics.median(v / b for v, b in zip(values, base, strict=True))
        found[name] = (
            statistics.median(values),
            paired,
            statistics.median(values) / statistics.median(base),
        )
    return found


def main() -> None:
    """Launch on 2 processes ``--runs`` times and print the table from rank 0's timings: each
    figure's median over the runs, with its spread (the lowest and highest run)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--block", type=int, default=20, help="steps per timed block")
    parser.add_argument("--runs", type=int, default=5, help="launches, each timing every round")
    args = parser.parse_args()
    runs = []
    cpu_runs: list[list[dict[str, tuple[float, float, float]]]] = []  # per run, per rank
    for _ in range(args.runs):
        results = nb_accel.notebook_launcher(
            measure, args=(args.rounds, args.block), num_processes=2, show_progress=False
        )
        runs.append(_ratios(results[0]["wall"]))
        cpu_runs.append([_ratios(result["cpu"]) for result in results])
    print(
        f"\nTraining step, MLP {FEATURES}-{HIDDEN}-{CLASSES}, batch {BATCH} per rank, "
        f"2 processes (gloo); {args.runs} runs of {args.rounds} rounds of {args.block} steps; "
        "medians over the runs, [lowest-highest run]"
    )
    print(
        f"{'contender':<40}  {'median ms':>9}  {'vs hand-written':>15}  {'paired, runs':>15}  "
        f"{'ratio of medians':>16}"
    )
    for name in runs[0]:
        times, paired, of_medians = ([run[name][i] for run in runs] for i in range(3))
        print(
            f"{name:<40}  {statistics.median(times) * 1e3:9.2f}  "
            f"{statistics.median(paired):14.3f}x  [{min(paired):.3f}-{max(paired):.3f}]  "
            f"{statistics.median(of_medians):9.3f}x [{min(of_medians):.3f}-{max(of_medians):.3f}]"
        )
    print("CPU time per step, each rank's own (process_time), paired per round as above:")
    for name in runs[0]:
        for rank in range(len(cpu_runs[0])):
            times = [run[rank][name][0] for run in cpu_runs]
            paired = [run[rank][name][1] for run in cpu_runs]
            print(
                f"{f'{name}, rank {rank}':<40}  {statistics.median(times) * 1e3:9.2f}  "
                f"{statistics.median(paired):14.3f}x  [{min(paired):.3f}-{max(paired):.3f}]"
            )
    paired = [run["nb_accel.Accelerator"][1] for run in runs]
    ratio = statistics.median(paired)
    verdict = "PASS" if ratio <= TARGET else "FAIL"
    print(
        f"target nb_accel <= {TARGET}x hand-written (paired, median of {args.runs} runs): "
        f"{ratio:.3f}x [{min(paired):.3f}-{max(paired):.3f}]  {verdict}"
    )


if __name__ == "__main__":
    main()
