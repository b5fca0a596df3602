"""Collectives under NCCL (skipped without two CUDA GPUs): CPU tensors are moved to the rank's
GPU and back, GPU tensors are used where they are, and gather runs one collective per tensor
outside debug mode."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pytest
import torch

from nb_accel import Accelerator, notebook_launcher
from nb_accel.runtime.device_types import cuda_facts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(cuda_facts.cuda_device_count() < 2, reason="needs two CUDA GPUs"),
]


def collectives_on_cpu_and_gpu_tensors() -> dict[str, Any]:
    from nb_accel.utils import broadcast, gather, pad_across_processes, reduce

    accelerator = Accelerator()
    rank = accelerator.process_index
    out: dict[str, Any] = {"backend": accelerator.state.backend}
    for where in ("cpu", "gpu"):
        device = torch.device("cpu") if where == "cpu" else accelerator.device
        base = torch.arange(3.0, device=device) + 10 * rank
        gathered = gather({"t": base, "scalar": torch.tensor(float(rank), device=device)})
        sent = torch.full((2, 2), float(rank), device=device)
        returned = broadcast(sent, from_process=1)
        reduced = reduce(base, "sum")
        padded = pad_across_processes(torch.ones(rank + 1, device=device))
        out[where] = {
            "gather": gathered["t"].tolist(),
            "scalar": gathered["scalar"].tolist(),
            "broadcast": sent.tolist(),
            "in_place": returned is sent,
            "reduce": reduced.tolist(),
            "pad": padded.tolist(),
            "devices": sorted({str(t.device.type) for t in (gathered["t"], sent, reduced, padded)}),
        }
    return out


def test_cpu_and_gpu_tensors_through_nccl_collectives() -> None:
    results = notebook_launcher(collectives_on_cpu_and_gpu_tensors, num_processes=2)
    for rank, out in enumerate(results):
        assert out["backend"] == "nccl"
        for where, device_type in (("cpu", "cpu"), ("gpu", "cuda")):
            mine = out[where]
            assert mine["gather"] == [0.0, 1.0, 2.0, 10.0, 11.0, 12.0]
            assert mine["scalar"] == [0.0, 1.0]
            assert mine["broadcast"] == [[1.0, 1.0], [1.0, 1.0]] and mine["in_place"]
            assert mine["reduce"] == [10.0, 12.0, 14.0]
            assert mine["pad"] == [1.0] * (rank + 1) + [0.0] * (1 - rank)
            assert mine["devices"] == [device_type]  # results where the caller's tensors were
    assert not torch.cuda.is_initialized()  # the launcher never touched CUDA in this process


def gather_collectives(debug: str) -> dict[str, Any]:
    import torch.distributed as dist

    from nb_accel.utils import DistributedOperationException, gather

    accelerator = Accelerator()
    os.environ["ACCELERATE_DEBUG_MODE"] = debug
    calls: Counter[str] = Counter()
    names = ("all_gather", "all_gather_into_tensor")
    real = {name: getattr(dist, name) for name in names}

    def counting(name: str) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return real[name](*args, **kwargs)

        return counted

    for name in names:
        setattr(dist, name, counting(name))
    try:
        gather(torch.ones(4, device=accelerator.device))
        counted = dict(calls)
        error = "no error"
        if debug == "1":
            try:
                gather(torch.ones(accelerator.process_index + 1, device=accelerator.device))
            except DistributedOperationException as exc:
                error = str(exc)
    finally:
        for name in names:
            setattr(dist, name, real[name])
    return {"calls": counted, "error": error}


def test_gather_adds_the_shape_check_only_in_debug_mode() -> None:
    for out in notebook_launcher(gather_collectives, args=("0",), num_processes=2):
        assert out["calls"] == {"all_gather_into_tensor": 1}
    for out in notebook_launcher(gather_collectives, args=("1",), num_processes=2):
        assert out["calls"] == {"all_gather_into_tensor": 1, "all_gather": 1}
        assert "first dimensions differ (process: size) {0: 1, 1: 2}" in out["error"]


def agreed_batch_size() -> int:
    """Rank 1 runs out of memory above 32 while rank 0 waits for it in an NCCL all_reduce."""
    import torch.distributed as dist

    from nb_accel import PartialState, find_executable_batch_size

    device = PartialState().device

    @find_executable_batch_size(starting_batch_size=64)
    def attempt(batch_size: int) -> int:
        if dist.get_rank() == 1 and batch_size > 32:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        total = torch.ones(batch_size, device=device)
        dist.all_reduce(total)
        torch.cuda.synchronize()
        return batch_size

    return attempt()


@pytest.mark.timeout(300)
def test_find_executable_batch_size_agrees_across_nccl_ranks() -> None:
    """The rank left waiting in an NCCL collective aborts its own communicator when the other
    says it ran out of memory; both retry and end at the same size."""
    assert notebook_launcher(agreed_batch_size, num_processes=2) == [32, 32]
