"""FSDP benchmark: per-rank memory under DDP and FSDP (the parameters, gradients and optimizer
state each rank holds, and the process's resident memory, steady and peak) at two model sizes,
and the step time of an FSDP loop through ``nb_accel.Accelerator`` versus the same loop written
by hand with torch's ``fully_shard``.

Run from the repository root: ``.venv/bin/python benchmarks/fsdp.py`` (also part of
``make bench``). Launches of 2 worker processes (gloo, CPU; ``--gpu`` for GPUs, NCCL):

1. memory, DDP: ``Accelerator()`` prepares a residual MLP of about 270 MB (fp32) and AdamW,
   then the same for a model of the same shape 4x smaller (about 67 MB);
2. memory, FSDP: the same with ``Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(...))``,
   each residual block its own unit;
3. step time: a smaller model of the same shape through both FSDP loops (and the hand-written
   one with the root resharded after forward too, as the plugin's ``reshard_after_forward``
   does), alternating in blocks of steps within the launch, each worker pinned to a core; the
   ratio is the median over rounds of each round's ratio to the hand-written block. The CPU
   column is both processes' CPU time per step (all threads), which other load on the machine
   disturbs less than the wall time.

Memory is counted two ways. From the tensors: after every backward pass and after every
optimizer step each rank adds up the bytes of the storages behind its parameters, their
gradients and the optimizer's state tensors (for a ``DTensor``, the storage of its local shard,
padding included), each storage once; the figure is the peak over the steps. From the process:
its resident set size (RSS) when the worker starts, before the model is built, is the baseline;
"steady" is how far above it the RSS is after the last step, "peak" how far above it the RSS
ever got (``resource``'s ``ru_maxrss``), which also holds activations, FSDP's gathered
parameters and reduce buffers, DDP's gradient buckets and what the allocator keeps; on GPUs the
peak of CUDA memory allocated (``torch.cuda.max_memory_allocated``) too.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

import psutil
import torch
import torch.distributed as dist

import nb_accel

MEMORY_SHAPE = (2048, 4096, 4)  # width, hidden width, residual blocks: 67.1 M parameters
SMALL_MEMORY_SHAPE = (1024, 2048, 4)  # 4x fewer: 16.8 M parameters
STEP_SHAPE = (256, 1024, 4)  # 2.1 M parameters
CLASSES = 16
MEMORY_TARGET = 0.55
STEP_TARGET = 1.05
MB = 1e6

Step = Callable[[], None]
Batches = list[tuple[torch.Tensor, torch.Tensor]]


class Block(torch.nn.Module):
    """A residual MLP block: ``x + down(relu(up(x)))``; the FSDP unit."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.up = torch.nn.Linear(width, hidden)
        self.down = torch.nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """One residual step."""
        return x + self.down(torch.relu(self.up(x)))


class Net(torch.nn.Module):
    """Residual blocks and a classification head."""

    def __init__(self, width: int, hidden: int, blocks: int) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(width, hidden) for _ in range(blocks))
        self.head = torch.nn.Linear(width, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits for ``x`` of shape (batch, width)."""
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make_model(shape: tuple[int, int, int]) -> Net:
    """The model every contender trains, the same weights on every rank."""
    torch.manual_seed(0)
    return Net(*shape)


def parameter_count(shape: tuple[int, int, int]) -> int:
    """Parameters of :func:`make_model` for ``shape``, without building it."""
    width, hidden, blocks = shape
    return blocks * (2 * width * hidden + width + hidden) + (width + 1) * CLASSES


def make_batches(width: int, batch: int, count: int) -> Batches:
    """``count`` batches for this rank (each rank its own), the same for every contender."""
    generator = torch.Generator().manual_seed(1 + dist.get_rank())
    return [
        (
            torch.randn(batch, width, generator=generator),
            torch.randint(0, CLASSES, (batch,), generator=generator),
        )
        for _ in range(count)
    ]


def plugin() -> nb_accel.FullyShardedDataParallelPlugin:
    """The FSDP options of the nb_accel contenders: each ``Block`` its own unit."""
    return nb_accel.FullyShardedDataParallelPlugin(
        auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Block"]
    )


# ---------------------------------------------------------------------------------------------
# Memory


def _storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the storages behind ``tensors`` (a DTensor's local shard), each counted once."""
    from torch.distributed.tensor import DTensor

    seen: dict[int, int] = {}
    for tensor in tensors:
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        storage = local.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _state_tensors(optimizer: torch.optim.Optimizer) -> Iterable[torch.Tensor]:
    for state in optimizer.state.values():
        yield from (v for v in state.values() if isinstance(v, torch.Tensor))


def held_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """What this rank holds now for parameters, gradients and optimizer state, in bytes."""
    parameters = list(model.parameters())
    return {
        "params": _storage_bytes(parameters),
        "grads": _storage_bytes(p.grad for p in parameters if p.grad is not None),
        "optimizer": _storage_bytes(_state_tensors(optimizer)),
    }


def live_bytes() -> int:
    """Bytes of the storages behind every tensor Python can reach in this process (a cross-check
    that nothing else, such as the model's full-size weights before sharding, stays alive)."""
    import gc
    import warnings

    gc.collect()
    with warnings.catch_warnings():  # isinstance() on deprecated module attributes warns
        warnings.simplefilter("ignore")
        tensors = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    return _storage_bytes(tensors)


def peak_rss() -> int:
    """The largest resident set size this process has had, in bytes (Linux counts KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory_worker(
    shape: tuple[int, int, int], sharded: bool, steps: int, batch: int
) -> dict[str, Any]:
    """A few AdamW steps through ``Accelerator`` (DDP, or FSDP when ``sharded``); the
    peak of the held bytes, the process's memory and the losses (runs on every rank)."""
    start_rss = psutil.Process().memory_info().rss
    accelerator = nb_accel.Accelerator(fsdp_plugin=plugin() if sharded else None)
    cuda = accelerator.device.type == "cuda"
    model = make_model(shape)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    peak: dict[str, int] = {"params": 0, "grads": 0, "optimizer": 0, "total": 0}
    losses = []

    def sample() -> None:
        now = held_bytes(model, optimizer)
        now["total"] = sum(now.values())
        if now["total"] > peak["total"]:
            peak.update(now)

    live = 0
    for inputs, labels in make_batches(shape[0], batch, steps):
        x, y = inputs.to(accelerator.device), labels.to(accelerator.device)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        accelerator.backward(loss)
        sample()  # parameters + gradients (+ the optimizer state of the step before)
        optimizer.step()
        sample()  # parameters + gradients + optimizer state
        losses.append(loss.item())
        live = max(live, live_bytes())
        optimizer.zero_grad()
    return {
        "peak": peak,
        "live": live,
        "losses": losses,
        "fsdp": accelerator.is_fsdp2,
        "rss": {
            "start": start_rss,
            "steady": psutil.Process().memory_info().rss - start_rss,
            "peak": peak_rss() - start_rss,
        },
        "cuda_peak": torch.cuda.max_memory_allocated(accelerator.device) if cuda else None,
    }


# ---------------------------------------------------------------------------------------------
# Step time


def hand_written(
    shape: tuple[int, int, int], batches: Batches, reshard_root: bool | None = None
) -> Step:
    """``fully_shard`` on each block, then on the model; plain AdamW; the loop by hand.

    The root's ``reshard_after_forward`` is torch's default (``None``: the blocks reshard after
    their forward, the root keeps its parameters gathered for the backward), or ``reshard_root``.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = make_model(shape)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_root)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    index = 0

    def step() -> None:
        nonlocal index
        x, y = batches[index % len(batches)]
        index += 1
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    return step


def through_nb_accel(shape: tuple[int, int, int], batches: Batches) -> Step:
    """The same through ``Accelerator(fsdp_plugin=...)``, as a user writes it."""
    accelerator = nb_accel.Accelerator(fsdp_plugin=plugin())
    model = make_model(shape)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    index = 0

    def step() -> None:
        nonlocal index
        x, y = batches[index % len(batches)]
        index += 1
        with accelerator.accumulate(model):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()

    return step


HAND = "hand-written fully_shard"
HAND_RESHARD = "  the same, root resharded too"
NB_ACCEL = "nb_accel.Accelerator(fsdp_plugin)"


def step_worker(
    shape: tuple[int, int, int], rounds: int, block: int, batch: int, warmup: int
) -> dict[str, dict[str, list[float]]]:
    """Per-step wall seconds and CPU seconds (this process, all its threads) per contender,
    alternating in blocks (runs on every rank)."""
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[dist.get_rank() % len(cores)]})
    batches = make_batches(shape[0], batch, 8)
    steps = {
        HAND: hand_written(shape, batches),
        HAND_RESHARD: hand_written(shape, batches, reshard_root=True),
        NB_ACCEL: through_nb_accel(shape, batches),
    }
    wall: dict[str, list[float]] = {name: [] for name in steps}
    cpu: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(warmup):
        for step in steps.values():
            step()
    for index in range(rounds):
        # every contender in every position: rotate, and reverse every other round
        items = list(steps.items())
        shift = (index // 2) % len(items)
        order = items[shift:] + items[:shift]
        order = order if index % 2 == 0 else order[::-1]
        for name, step in order:
            dist.barrier()
            start, start_cpu = time.perf_counter(), time.process_time()
            for _ in range(block):
                step()
            dist.barrier()
            wall[name].append((time.perf_counter() - start) / block)
            cpu[name].append((time.process_time() - start_cpu) / block)
    return {"wall": wall, "cpu": cpu}


# ---------------------------------------------------------------------------------------------
# Report


#: Launch on the GPUs (NCCL) rather than the CPU (``--gpu``; memory only).
ON_GPU = [False]


def _launch(function: Callable[..., Any], *args: Any) -> list[Any]:
    # fsdp=False and mixed_precision="no" whatever a saved configuration says: the contenders
    # that shard pass their own plugin
    return nb_accel.notebook_launcher(
        function,
        args=args,
        num_processes=2,
        cpu=not ON_GPU[0],
        show_progress=False,
        fsdp=False,
        mixed_precision="no",
    )


def _shape_text(shape: tuple[int, int, int]) -> str:
    width, hidden, blocks = shape
    size = parameter_count(shape) * 4 / MB
    return f"{blocks} residual blocks {width}-{hidden}-{width} ({size:.1f} MB fp32)"


def _where() -> str:
    return "NCCL" if ON_GPU[0] else "gloo"


def report_held(
    shape: tuple[int, int, int], ddp: list[Any], fsdp: list[Any], steps: int, batch: int
) -> None:
    """Print the per-rank peaks of what the tensors hold, and the checks on them."""
    print(
        f"\nPer-rank parameters + gradients + AdamW state, {_shape_text(shape)}, "
        f"batch {batch} per rank, 2 processes ({_where()}); peak over {steps} steps"
    )
    print(
        f"{'contender':<34}  {'rank':>4}  {'params MB':>9}  {'grads MB':>8}  "
        f"{'optim MB':>8}  {'total MB':>8}  {'vs DDP':>7}"
    )
    ratios = []
    for name, results in (("DDP: Accelerator()", ddp), ("FSDP: Accelerator(fsdp_plugin)", fsdp)):
        for rank, result in enumerate(results):
            peak = result["peak"]
            ratio = peak["total"] / ddp[rank]["peak"]["total"]
            if results is fsdp:
                ratios.append(ratio)
            print(
                f"{name:<34}  {rank:>4}  {peak['params'] / MB:9.1f}  {peak['grads'] / MB:8.1f}  "
                f"{peak['optimizer'] / MB:8.1f}  {peak['total'] / MB:8.1f}  {ratio:6.3f}x"
            )
    worst = max(ratios)
    verdict = "PASS" if worst <= MEMORY_TARGET else "FAIL"
    print(f"target FSDP <= {MEMORY_TARGET}x DDP per rank (worst rank): {worst:.3f}x  {verdict}")
    difference = max(
        abs(a - b) / abs(b)
        for d, f in zip(ddp, fsdp, strict=True)
        for a, b in zip(f["losses"], d["losses"], strict=True)
    )
    print(f"same losses under DDP and FSDP: largest relative difference {difference:.1e}")
    print(
        "every tensor Python reaches, after each step, largest rank: "
        f"DDP {max(r['live'] for r in ddp) / MB:.1f} MB, "
        f"FSDP {max(r['live'] for r in fsdp) / MB:.1f} MB"
    )


def report_process_memory(runs: dict[tuple[int, int, int], tuple[list[Any], list[Any]]]) -> None:
    """Print each rank's resident memory above its start, steady and peak, FSDP against DDP,
    for every model size (and the CUDA peak on GPUs)."""
    cuda = ON_GPU[0]
    print(
        f"\nPer-rank process memory above the worker's start (RSS), 2 processes ({_where()}): "
        "steady after the last step, peak over the run"
    )
    header = (
        f"{'model':<8}  {'contender':<5}  {'rank':>4}  {'start MB':>8}  {'steady MB':>9}  "
        f"{'peak MB':>8}  {'steady vs DDP':>13}  {'peak vs DDP':>11}"
    )
    print(header + (f"  {'CUDA peak MB':>12}  {'vs DDP':>7}" if cuda else ""))
    for shape, (ddp, fsdp) in runs.items():
        size = f"{parameter_count(shape) * 4 / MB:.0f} MB"
        for name, results in (("DDP", ddp), ("FSDP", fsdp)):
            for rank, result in enumerate(results):
                rss, base = result["rss"], ddp[rank]["rss"]
                line = (
                    f"{size:<8}  {name:<5}  {rank:>4}  {rss['start'] / MB:8.1f}  "
                    f"{rss['steady'] / MB:9.1f}  {rss['peak'] / MB:8.1f}  "
                    f"{rss['steady'] / base['steady']:12.3f}x  {rss['peak'] / base['peak']:10.3f}x"
                )
                if cuda:
                    peak, ddp_peak = result["cuda_peak"], ddp[rank]["cuda_peak"]
                    line += f"  {peak / MB:12.1f}  {peak / ddp_peak:6.3f}x"
                print(line)


def report_memory(steps: int, batch: int) -> None:
    """Launch DDP, then FSDP, at both model sizes; print the per-rank peaks."""
    runs = {}
    for shape in (MEMORY_SHAPE, SMALL_MEMORY_SHAPE):
        ddp = _launch(memory_worker, shape, False, steps, batch)
        fsdp = _launch(memory_worker, shape, True, steps, batch)
        if not all(r["fsdp"] for r in fsdp) or any(r["fsdp"] for r in ddp):
            raise RuntimeError("the FSDP launch did not shard, or the DDP launch did")
        runs[shape] = (ddp, fsdp)
    report_held(MEMORY_SHAPE, *runs[MEMORY_SHAPE], steps, batch)
    report_process_memory(runs)


def _paired(values: list[float], base: list[float]) -> float:
    return statistics.median(v / b for v, b in zip(values, base, strict=True))


def report_steps(
    shape: tuple[int, int, int], rounds: int, block: int, batch: int, warmup: int
) -> None:
    """Launch the step-time comparison and print rank 0's table."""
    results = _launch(step_worker, shape, rounds, block, batch, warmup)
    wall = results[0]["wall"]  # the barriers end every block at the same time on both ranks
    cpu = {  # both processes' CPU time per step
        name: [sum(values) for values in zip(*(r["cpu"][name] for r in results), strict=True)]
        for name in wall
    }
    print(
        f"\nTraining step, FSDP2, {_shape_text(shape)}, AdamW, batch {batch} per rank, "
        f"2 processes (gloo); {rounds} rounds of {block} step{'s' * (block != 1)} after {warmup} "
        "warm-up steps"
    )
    print(
        f"{'contender':<34}  {'median ms':>9}  {'min ms':>7}  {'vs hand-written':>15}  "
        f"{'CPU ms':>7}  {'CPU vs hand-written':>19}"
    )
    ratios = {}
    for name in wall:
        # Each round's blocks ran back to back: pair them to cancel slow drifts of the machine.
        ratios[name] = _paired(wall[name], wall[HAND])
        print(
            f"{name:<34}  {statistics.median(wall[name]) * 1e3:9.2f}  {min(wall[name]) * 1e3:7.2f}"
            f"  {ratios[name]:14.3f}x  {statistics.median(cpu[name]) * 1e3:7.2f}  "
            f"{_paired(cpu[name], cpu[HAND]):18.3f}x"
        )
    ratio = ratios[NB_ACCEL]
    verdict = "PASS" if ratio <= STEP_TARGET else "FAIL"
    print(
        f"target nb_accel <= {STEP_TARGET}x hand-written (paired median): {ratio:.3f}x  {verdict}"
    )


def main() -> None:
    """Run both parts and print their tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memory-steps", type=int, default=3)
    parser.add_argument("--memory-batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=120)
    parser.add_argument("--block", type=int, default=1, help="steps per timed block")
    parser.add_argument("--batch", type=int, default=32, help="step-time batch per rank")
    parser.add_argument("--warmup", type=int, default=5, help="step-time warm-up steps")
    parser.add_argument(
        "--step-shape",
        default=",".join(map(str, STEP_SHAPE)),
        help="step-time model: width,hidden,blocks",
    )
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--gpu", action="store_true", help="memory on 2 GPUs (NCCL) instead")
    parser.add_argument("--skip-steps", action="store_true")
    args = parser.parse_args()
    ON_GPU[0] = args.gpu
    if not args.skip_memory:
        report_memory(args.memory_steps, args.memory_batch)
    if not args.skip_steps:
        width, hidden, blocks = (int(n) for n in args.step_shape.split(","))
        report_steps((width, hidden, blocks), args.rounds, args.block, args.batch, args.warmup)


if __name__ == "__main__":
    main()
