"""Device-mesh benchmark: what each rank holds under HSDP and under tensor parallelism with
FSDP2 against DDP on the same 4 processes, and the step time of each through
``nb_accel.Accelerator`` against the same loop written by hand with torch's
``parallelize_module`` and ``fully_shard``.

Run from the repository root::

    .venv/bin/python benchmarks/parallelism.py [--rounds 40] [--layouts hsdp tp]

Launches of 4 CPU worker processes (gloo), the residual MLP of ``benchmarks/fsdp.py``:

1. memory: ``Accelerator(parallelism_config=ParallelismConfig(dp_replicate_size=4))`` (DDP),
   ``ParallelismConfig(dp_replicate_size=2, dp_shard_size=2)`` (HSDP) and
   ``ParallelismConfig(tp_size=2, dp_shard_size=2)`` (each block's ``up`` column-wise and
   ``down`` row-wise over ``tp``, FSDP2 over ``dp_shard``) prepare the 16.8 M parameter model
   and AdamW; after a few steps each rank adds up the bytes behind its parameters, gradients
   and optimizer state (``fsdp.held_bytes``), the peak over the steps;
2. step time: a 2.1 M parameter model through the Accelerator (each block its own unit) and by
   hand (``init_device_mesh("cpu", (2, 2))``, the same plan, ``fully_shard`` on each block and
   on the model, plain AdamW), alternating in blocks of steps within one launch; the ratio is
   the median over rounds of each round's ratio. Four ranks share two cores here, so the wall
   times are noisy; the CPU column (all threads of the process) less so.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fsdp  # the model, the batches and the byte counts of the FSDP benchmark

import nb_accel

HSDP = {"dp_replicate_size": 2, "dp_shard_size": 2}
TP = {"tp_size": 2, "dp_shard_size": 2}
DDP = {"dp_replicate_size": 4}
#: The layouts compared, by the name the command line takes: sizes, mesh dimension names.
LAYOUTS = {
    "hsdp": ("HSDP, 2 replicas x 2 shards", HSDP, ("dp_replicate", "dp_shard")),
    "tp": ("TP 2 x FSDP 2 shards", TP, ("dp_shard", "tp")),
}
STEP_TARGET = 1.05


def _parallelise(model: Any, mesh: Any) -> None:
    """Each block's ``up`` column-wise and ``down`` row-wise over ``mesh`` (the head stays
    whole on every rank)."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    for block in model.blocks:
        parallelize_module(block, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})


def _accelerated(sizes: dict[str, int], shape: tuple[int, int, int]) -> tuple[Any, Any, Any]:
    config = nb_accel.ParallelismConfig(**sizes)
    sharded = sizes.get("dp_shard_size", 1) > 1
    accelerator = nb_accel.Accelerator(
        parallelism_config=config, fsdp_plugin=fsdp.plugin() if sharded else None
    )
    model = fsdp.make_model(shape)
    if sizes.get("tp_size", 1) > 1:
        _parallelise(model, accelerator.torch_device_mesh["tp"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


def memory_worker(sizes: dict[str, int], steps: int) -> dict[str, int]:
    """The peak bytes this rank holds for parameters, gradients and optimizer state."""
    accelerator, model, optimizer = _accelerated(sizes, fsdp.SMALL_MEMORY_SHAPE)
    peak: dict[str, int] = {}
    for x, y in fsdp.make_batches(fsdp.SMALL_MEMORY_SHAPE[0], 8, steps):
        accelerator.backward(torch.nn.functional.cross_entropy(model(x), y))
        for name, value in fsdp.held_bytes(model, optimizer).items():
            peak[name] = max(peak.get(name, 0), value)
        optimizer.step()
        optimizer.zero_grad()
    return peak


def _hand_written(layout: str, shape: tuple[int, int, int], batches: fsdp.Batches) -> fsdp.Step:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    names = LAYOUTS[layout][2]
    model = fsdp.make_model(shape)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=names)
    shards = mesh
    if "tp" in names:
        _parallelise(model, mesh["tp"])
        shards = mesh["dp_shard"]
    for block in model.blocks:
        fully_shard(block, mesh=shards)
    fully_shard(model, mesh=shards, reshard_after_forward=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return _stepper(model, optimizer, batches, lambda loss: loss.backward())


def _through_nb_accel(layout: str, shape: tuple[int, int, int], batches: fsdp.Batches) -> fsdp.Step:
    accelerator, model, optimizer = _accelerated(LAYOUTS[layout][1], shape)
    return _stepper(model, optimizer, batches, accelerator.backward)


def _stepper(model: Any, optimizer: Any, batches: fsdp.Batches, backward: Any) -> fsdp.Step:
    index = [0]

    def step() -> None:
        x, y = batches[index[0] % len(batches)]
        index[0] += 1
        backward(torch.nn.functional.cross_entropy(model(x), y))
        optimizer.step()
        optimizer.zero_grad()

    return step


def step_worker(layout: str, rounds: int, block: int) -> dict[str, list[float]]:
    """Per-step wall and CPU seconds of both contenders, alternating (runs on every rank)."""
    batches = fsdp.make_batches(fsdp.STEP_SHAPE[0], 32, 8)
    steps = {
        "hand": _hand_written(layout, fsdp.STEP_SHAPE, batches),
        "nb_accel": _through_nb_accel(layout, fsdp.STEP_SHAPE, batches),
    }
    found: dict[str, list[float]] = {f"{n} {k}": [] for n in steps for k in ("wall", "cpu")}
    for _ in range(3):
        for step in steps.values():
            step()
    for index in range(rounds):
        order = list(steps.items()) if index % 2 == 0 else list(steps.items())[::-1]
        for name, step in order:
            dist.barrier()
            start, start_cpu = time.perf_counter(), time.process_time()
            for _ in range(block):
                step()
            dist.barrier()
            found[f"{name} wall"].append((time.perf_counter() - start) / block)
            found[f"{name} cpu"].append((time.process_time() - start_cpu) / block)
    return found


def _launch(function: Any, *args: Any) -> list[Any]:
    return nb_accel.notebook_launcher(
        function, args=args, num_processes=4, cpu=True, show_progress=False, fsdp=False
    )


def _ratio(values: list[float], base: list[float]) -> tuple[float, float, float]:
    ratios = sorted(v / b for v, b in zip(values, base, strict=True))
    return statistics.median(ratios), ratios[len(ratios) // 10], ratios[-1 - len(ratios) // 10]


def main() -> None:
    """Run both parts and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--block", type=int, default=2, help="steps per timed block")
    parser.add_argument("--memory-steps", type=int, default=3)
    parser.add_argument("--layouts", nargs="+", choices=list(LAYOUTS), default=list(LAYOUTS))
    options = parser.parse_args()
    compared = [("DDP, 4 replicas", DDP)] + [LAYOUTS[n][:2] for n in options.layouts]
    held = {
        name: _launch(memory_worker, sizes, options.memory_steps)[0] for name, sizes in compared
    }
    print("Held per rank (rank 0; MB, peak over the steps), 4 CPU ranks, 16.8 M parameters")
    print(f"{'':<30}{'params':>9}{'grads':>9}{'AdamW':>9}{'total':>9}{'/ DDP':>9}")
    ddp_total = sum(held["DDP, 4 replicas"].values())
    for name, found in held.items():
        row = [found["params"], found["grads"], found["optimizer"], sum(found.values())]
        ratio = sum(found.values()) / ddp_total
        print(f"{name:<30}" + "".join(f"{v / 1e6:9.1f}" for v in row) + f"{ratio:9.3f}")
    for layout in options.layouts:
        timed = _launch(step_worker, layout, options.rounds, options.block)[0]
        print(
            f"\nStep time, {LAYOUTS[layout][0]}, 2.1 M parameters, {options.rounds} rounds of "
            f"{options.block} steps"
        )
        for kind in ("wall", "cpu"):
            hand, ours = timed[f"hand {kind}"], timed[f"nb_accel {kind}"]
            median, low, high = _ratio(ours, hand)
            print(
                f"{kind:<5} hand {statistics.median(hand) * 1e3:7.2f} ms  nb_accel "
                f"{statistics.median(ours) * 1e3:7.2f} ms  ratio {median:.3f} "
                f"(10-90%: {low:.3f}-{high:.3f})  target <= {STEP_TARGET}"
            )


if __name__ == "__main__":
    main()
