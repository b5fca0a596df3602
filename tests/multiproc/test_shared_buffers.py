"""Big tensors and arrays reach spawned, forkserver and pool workers through shared memory,
written once and mapped by every rank, and big results come back the same way; a rank's writes
stay its own; nothing is left in ``/dev/shm``, even after a worker or the launching process is
SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import psutil
import pytest
import torch
import torch.distributed as dist

from nb_accel import notebook_launcher
from nb_accel.errors import WorkerDiedError
from nb_accel.launch.pool import WorkerPool, load_value
from nb_accel.worker.transfer.segments import SHARE_DIR_ENV, shared_root

pytestmark = pytest.mark.timeout(300)

#: Elements of each big float32 tensor or float64 column (64 MB each).
ELEMENTS = 16_000_000
SIZE_MB = 64


def _private_mb() -> float:
    return psutil.Process().memory_full_info().uss / 2**20


def read_everything(tensor: torch.Tensor, array: np.ndarray, frame: pd.DataFrame) -> dict:
    """The sums of what the rank was given, and its private memory once every rank has read
    all of it (a page that only one process has mapped yet counts as its private memory)."""
    sums = (float(tensor.sum()), float(array.sum()), float(frame["x"].sum()))
    dist.barrier()
    return {"sums": sums, "private_mb": _private_mb()}


def _inputs(elements: int) -> tuple[torch.Tensor, np.ndarray, pd.DataFrame]:
    tensor = torch.ones(elements * 2)  # float32: as many bytes as the float64 ones
    array = np.full(elements, 2.0)
    frame = pd.DataFrame({"x": np.full(elements, 3.0)})
    return tensor, array, frame


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_big_arguments_are_mapped_by_every_rank_not_copied(start_method: str) -> None:
    small = notebook_launcher(
        read_everything, args=_inputs(1000), num_processes=2, start_method=start_method
    )
    big = notebook_launcher(
        read_everything, args=_inputs(ELEMENTS), num_processes=2, start_method=start_method
    )
    for rank in range(2):
        assert big[rank]["sums"] == (2.0 * ELEMENTS, 2.0 * ELEMENTS, 3.0 * ELEMENTS)
        added = big[rank]["private_mb"] - small[rank]["private_mb"]
        read = 3 * SIZE_MB
        assert added < read / 4, f"rank {rank}: {added:.0f} MB more private, {read} MB read"


def transform(
    weights: torch.Tensor, model: torch.nn.Module, array: np.ndarray, halves: torch.Tensor
) -> dict[str, Any]:
    """A deterministic function of big and small inputs, returning big and small values."""
    view = weights[10:20]
    tied = model[0].weight is model[1].weight
    return {
        "scaled": weights * (dist.get_rank() + 1),
        "view_shares_storage": view.untyped_storage().data_ptr() == weights.data_ptr(),
        "tied": tied,
        "model_sum": float(sum(p.sum() for p in model.parameters())),
        "array": array[::2].copy(),
        "halves": halves.to(torch.float32).sum().item(),
        "pair": (weights[:3].clone(), weights[:3].clone()),
    }


def _tied_model() -> torch.nn.Module:
    torch.manual_seed(0)
    first, second = torch.nn.Linear(512, 512), torch.nn.Linear(512, 512)
    second.weight = first.weight
    return torch.nn.Sequential(first, second)


@pytest.mark.timeout(400)
def test_results_are_identical_under_fork_spawn_and_forkserver() -> None:
    weights = torch.arange(ELEMENTS, dtype=torch.float32)
    args = (weights, _tied_model(), np.arange(ELEMENTS // 4, dtype=np.int64), torch.ones(3))
    by_method = {
        method: notebook_launcher(transform, args=args, num_processes=2, start_method=method)
        for method in ("fork", "spawn", "forkserver")
    }
    for method, results in by_method.items():
        for rank, result in enumerate(results):
            assert torch.equal(result["scaled"], weights * (rank + 1)), method
            assert result["view_shares_storage"] and result["tied"], method
            assert np.array_equal(result["array"], np.arange(0, ELEMENTS // 4, 2)), method
            assert result["halves"] == 3.0
            assert result["model_sum"] == by_method["fork"][rank]["model_sum"], method
            one, two = result["pair"]
            assert torch.equal(one, weights[:3]) and torch.equal(two, weights[:3])


def write_then_read(tensor: torch.Tensor, array: np.ndarray) -> tuple[float, float]:
    """Rank 1 writes into what it was given; then every rank reads its own."""
    if dist.get_rank() == 1:
        tensor.add_(1.0)
        array += 1.0
    dist.barrier()
    return float(tensor.sum()), float(array.sum())


@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
def test_a_rank_s_writes_are_its_own(start_method: str) -> None:
    tensor, array = torch.zeros(ELEMENTS), np.zeros(ELEMENTS // 2)
    results = notebook_launcher(
        write_then_read, args=(tensor, array), num_processes=2, start_method=start_method
    )
    assert results == [(0.0, 0.0), (float(ELEMENTS), float(ELEMENTS // 2))]
    assert float(tensor.sum()) == 0.0 and float(array.sum()) == 0.0  # the kernel's too


def big_result(elements: int) -> torch.Tensor:
    return torch.full((elements,), float(dist.get_rank()))


def _mapped_file(address: int) -> str | None:
    """The file mapped at ``address`` in this process, if it is a file mapping."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        start, end = (int(part, 16) for part in fields[0].split("-"))
        if start <= address < end:
            return fields[5] if len(fields) == 6 else None
    return None


def test_a_big_result_is_mapped_from_shared_memory_not_sent_through_the_pipe() -> None:
    results = notebook_launcher(big_result, args=(ELEMENTS,), num_processes=2)
    for rank, tensor in enumerate(results):
        assert torch.equal(tensor, torch.full((ELEMENTS,), float(rank)))
        mapped = _mapped_file(tensor.data_ptr())
        assert mapped is not None and mapped.startswith(shared_root()), mapped
        assert mapped.endswith("(deleted)")  # its file is gone; the mapping is the kernel's
    small = notebook_launcher(big_result, args=(1000,), num_processes=2)
    in_pickle = _mapped_file(small[0].data_ptr())  # small results travel in the pickle
    assert in_pickle is None or not in_pickle.startswith(shared_root()), in_pickle


def _shared_entries(*pids: int) -> set[str]:
    """What the shared-memory folder holds for this process's launches (and those of
    ``pids``): nb_accel's folders and the files in them (other programs' entries come and
    go on their own)."""
    root = Path(shared_root())
    owners = {os.getpid(), *pids}
    entries = set()
    for entry in root.iterdir():
        parts = entry.name.split("-")
        if len(parts) < 3 or parts[0] != "nb_accel" or not parts[2].isdigit():
            continue
        if int(parts[2]) in owners:
            entries.add(entry.name)
            entries.update(f"{entry.name}/{inner.name}" for inner in entry.iterdir())
    return entries


@pytest.fixture
def shared_memory_is_left_as_found() -> Iterator[set[str]]:
    """The shared-memory folder's entries before the test; checked unchanged after it."""
    before = _shared_entries()
    yield before
    assert _shared_entries() == before


@pytest.mark.usefixtures("shared_memory_is_left_as_found")
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_launch_leaves_nothing_in_shared_memory(start_method: str) -> None:
    results = notebook_launcher(
        transform,
        args=(torch.ones(ELEMENTS), _tied_model(), np.ones(ELEMENTS // 4), torch.ones(3)),
        num_processes=2,
        start_method=start_method,
    )
    assert results[1]["scaled"].sum() == 2 * ELEMENTS


def killed_after_rank_0_wrote_its_result(big: torch.Tensor) -> torch.Tensor:
    """Rank 0 returns a big result; rank 1 SIGKILLs itself once that result's segment is
    written (the payload's and the result's segments are both in the launch's folder then)."""
    if dist.get_rank() == 0:
        return big * 2
    folder = Path(os.environ[SHARE_DIR_ENV])
    while len(list(folder.glob("buffers-*"))) < 2:
        os.sched_yield()
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")


@pytest.mark.usefixtures("shared_memory_is_left_as_found")
def test_segments_are_removed_after_a_worker_is_sigkilled() -> None:
    with pytest.raises(WorkerDiedError):
        notebook_launcher(
            killed_after_rank_0_wrote_its_result,
            args=(torch.ones(ELEMENTS),),
            num_processes=2,
            start_method="spawn",
        )


#: A kernel that launches with a big argument; its rank 0 writes ``marker`` and then waits.
KILLED_KERNEL = """
import sys, time
import torch
from nb_accel import notebook_launcher

def wait_forever(big, marker):
    import torch.distributed as dist
    if dist.get_rank() == 0:
        open(marker, "w").close()
    while True:
        time.sleep(1)

notebook_launcher(wait_forever, args=(torch.ones(4_000_000), sys.argv[1]), num_processes=2,
                  start_method="spawn")
"""


def test_the_next_launch_removes_what_a_sigkilled_kernel_left(
    tmp_path: Path, shared_memory_is_left_as_found: set[str]
) -> None:
    marker = tmp_path / "rank0-waiting"
    kernel = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(KILLED_KERNEL), str(marker)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        parent = psutil.Process(kernel.pid)
        while not marker.exists():
            assert kernel.poll() is None, "the kernel ended before its ranks started"
            os.sched_yield()
        workers = parent.children(recursive=True)
        kernel.send_signal(signal.SIGKILL)
        kernel.wait(timeout=60)
        _, alive = psutil.wait_procs(workers, timeout=60)  # they die with their kernel
        assert alive == []
        left = _shared_entries(kernel.pid) - shared_memory_is_left_as_found
        assert any(name.startswith(f"nb_accel-launch-{kernel.pid}-") for name in left), left
    finally:
        if kernel.poll() is None:
            kernel.kill()
            kernel.wait(timeout=60)
    assert notebook_launcher(big_result, args=(10,), num_processes=2)[1].sum() == 10.0
    assert _shared_entries(kernel.pid) == shared_memory_is_left_as_found


@pytest.fixture
def pool() -> Iterator[WorkerPool]:
    """A started two-rank CPU pool, stopped after the test."""
    workers = WorkerPool(2, cpu=True)
    workers.start()
    try:
        yield workers
    finally:
        workers.stop(graceful=False)


PRIVATE_MB = """
import psutil
psutil.Process().memory_full_info().uss / 2**20
"""


@pytest.mark.usefixtures("shared_memory_is_left_as_found")
def test_a_push_is_mapped_by_every_rank_and_a_pull_comes_back_shared(pool: WorkerPool) -> None:
    before = pool.execute(PRIVATE_MB, want_value=True)
    pool.push({"pushed": np.full(ELEMENTS, 2.0), "weights": torch.ones(ELEMENTS * 2)})
    read = pool.execute(
        "import torch.distributed as dist\ntotal = float(pushed.sum()) + float(weights.sum())\n"
        "dist.barrier()\n" + PRIVATE_MB,
        want_value=True,
    )
    for rank in range(2):
        added = load_value(read[rank]) - load_value(before[rank])
        assert added < 2 * SIZE_MB / 4, f"rank {rank}: {added:.0f} MB more private"
    assert pool.pull("total") == [4.0 * ELEMENTS, 4.0 * ELEMENTS]
    pulled = pool.pull("weights")
    assert all(torch.equal(tensor, torch.ones(ELEMENTS * 2)) for tensor in pulled)
    assert (_mapped_file(pulled[1].data_ptr()) or "").startswith(shared_root())
