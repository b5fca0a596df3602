"""Big tensors and arrays reach spawned, forkserver and pool workers through shared memory,
written once and mapped by every rank, and big results come back the same way; a rank's writes
stay its own; nothing is left in ``/dev/shm``, even after a worker or the launching process is
SIGKILLed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import psutil
import pytest
import system_features
import torch
import torch.distributed as dist
from own_folders import own_folders_command

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

#: Kills :data:`KILLED_KERNEL` once its ranks run, then launches: what the killed kernel left
#: in ``/dev/shm``, what the next launch returned, and what was left after it.
KILLS_THEN_LAUNCHES = """
import json, os, signal, subprocess, sys
import psutil, torch
from nb_accel import notebook_launcher

def big_result(n):
    import torch.distributed as dist
    return torch.full((4_000_000,), float(dist.get_rank())) + n

def left(pid):
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"nb_accel-launch-{pid}-"))

marker = sys.argv[1]
kernel = subprocess.Popen([sys.executable, "-c", sys.argv[2], marker])
while not os.path.exists(marker):
    assert kernel.poll() is None, "the kernel ended before its ranks started"
    os.sched_yield()
workers = psutil.Process(kernel.pid).children(recursive=True)
kernel.send_signal(signal.SIGKILL)
kernel.wait(timeout=60)
_, alive = psutil.wait_procs(workers, timeout=60)  # they die with their kernel
outcome = {"alive": len(alive), "left": left(kernel.pid)}
result = notebook_launcher(big_result, args=(10,), num_processes=2)
outcome["result"] = float(result[1][0])
outcome["after"] = left(kernel.pid) + sorted(os.listdir("/dev/shm"))
print("OUTCOME", json.dumps(outcome))
"""


def test_the_next_launch_removes_what_a_sigkilled_kernel_left(tmp_path: Path) -> None:
    """In a ``/dev/shm`` of their own (a launch anywhere else on the machine, another test's,
    would remove the killed kernel's folder first: every launch removes those of kernels that
    are gone)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        system_features.unavailable("needs root and unshare for a /dev/shm of its own")
    script = tmp_path / "kills_then_launches.py"
    script.write_text(KILLS_THEN_LAUNCHES)
    command = [sys.executable, str(script), str(tmp_path / "rank0-waiting"), KILLED_KERNEL]
    done = subprocess.run(
        [
            *("unshare", "--mount", "--propagation", "private", "--"),
            *own_folders_command([tmp_path], command),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("OUTCOME ")]
    assert lines, done.stdout + done.stderr
    outcome = json.loads(lines[-1].removeprefix("OUTCOME "))
    assert outcome["alive"] == 0, outcome
    assert outcome["left"], outcome  # the killed kernel's launch folder
    assert outcome["result"] == 11.0, outcome
    assert outcome["after"] == [], outcome  # removed by the next launch, which removed its own


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
