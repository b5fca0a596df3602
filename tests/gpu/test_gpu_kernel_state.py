"""What a kernel's own CUDA state does to launches, on real GPUs (skipped without CUDA).

Every kernel here is a subprocess running a small script: this pytest process never initialises
CUDA (and ``PYTORCH_NVML_BASED_CUDA_CHECK``, which importing nb_accel sets here, is removed from
the scripts' environment so that they see what a fresh kernel sees).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nb_accel.runtime.device_types import cuda_facts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(cuda_facts.cuda_device_count() == 0, reason="needs a CUDA GPU"),
]

#: Shared by the scripts: a function every launch runs, and a launch that prints its outcome.
PRELUDE = """
import os, sys
import torch


def all_reduce():
    import torch.distributed as dist
    value = torch.ones(1, device="cuda")
    dist.all_reduce(value)
    return value


def launch(**options):
    from nb_accel import notebook_launcher
    try:
        [value] = notebook_launcher(all_reduce, num_processes=1, show_progress=False, **options)
    except Exception as error:
        print("failed:", type(error).__name__, str(error).splitlines()[0], flush=True)
        return
    print("result:", value.device.type, value.item(), flush=True)
"""


def _kernel(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    """Run ``PRELUDE + body`` as a fresh process, as a notebook kernel would run the cells."""
    script = tmp_path / "kernel.py"
    script.write_text(PRELUDE + body)
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_NVML_BASED_CUDA_CHECK"}
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


IS_AVAILABLE_FIRST = """
if __name__ == "__main__":
    device = "cuda" if torch.cuda.is_available() else "cpu"  # before nb_accel: poisons fork
    import nb_accel
    from nb_accel.runtime.device_types import cuda_facts
    print("initialized:", torch.cuda.is_initialized(), flush=True)  # torch cannot tell
    print("works after fork:", cuda_facts.cuda_works_after_fork(), flush=True)
    launch()                      # falls back to warm workers started by forkserver, saying so
    launch()                      # on the same warm workers
    launch(reuse_workers=False)   # a fresh forkserver launch, saying so
    launch(start_method="fork")   # an explicit fork keeps the clear error
    nb_accel.stop_workers()
"""


@pytest.mark.timeout(300)
def test_is_available_before_import_falls_back_to_forkserver(tmp_path: Path) -> None:
    done = _kernel(tmp_path, IS_AVAILABLE_FIRST)
    assert "initialized: False" in done.stdout
    assert "works after fork: False" in done.stdout
    assert "result: cpu 1.0" in done.stdout
    assert done.stderr.count("launches run on warm workers, started once with forkserver") == 2
    assert done.stderr.count("starting workers with forkserver instead of fork") == 1
    assert "failed: LaunchError CUDA is already initialised in this kernel" in done.stdout


IMPORT_FIRST = """
if __name__ == "__main__":
    import nb_accel
    from nb_accel.runtime.device_types import cuda_facts, cuda_fork
    device = "cuda" if torch.cuda.is_available() else "cpu"  # after nb_accel: asks NVML
    assert device == "cuda"
    count = cuda_facts.cuda_device_count()
    torch.cuda._device_count_nvml = lambda: -1   # as with MIG ids: NVML cannot count
    print("count without NVML:", cuda_facts.cuda_device_count() == count, flush=True)
    print("child:", cuda_fork.ask_forked_child(), flush=True)
    print("works after fork:", cuda_facts.cuda_works_after_fork(), flush=True)
    launch(start_method="fork")
    print("initialized:", torch.cuda.is_initialized(), flush=True)
"""


@pytest.mark.timeout(300)
def test_nb_accel_never_poisons_fork_itself(tmp_path: Path) -> None:
    done = _kernel(tmp_path, IMPORT_FIRST)
    assert "count without NVML: True" in done.stdout
    assert "child: ForkedCuda(bad_fork=False, device_count=" in done.stdout
    assert "works after fork: True" in done.stdout
    assert "result: cpu 1.0" in done.stdout
    assert "initialized: False" in done.stdout
    assert "instead of fork" not in done.stderr


RETURNS_CUDA = """
import dataclasses, collections


@dataclasses.dataclass
class Result:
    weights: object
    extras: dict


Pair = collections.namedtuple("Pair", "left right")


def cuda_values():
    cuda = torch.ones(2, device="cuda")
    model = torch.nn.Linear(2, 2).cuda()
    return Result(cuda, {"pair": Pair(cuda * 2, [model]), "storage": cuda.untyped_storage()})


def describe(value):
    linear = value.extras["pair"].right[0]
    return sorted({value.weights.device.type, value.extras["pair"].left.device.type,
                   linear.weight.device.type, value.extras["storage"].device.type})


if __name__ == "__main__":
    import nb_accel
    from nb_accel import notebook_launcher
    from nb_accel.launch.pool import WorkerPool, load_value
    from nb_accel.runtime.device_types import cuda_facts
    which = sys.argv[1]
    if which == "pool":
        pool = WorkerPool(1, start_method="fork")
        pool.start()
        pool.push({"cuda_values": cuda_values})
        value = load_value(pool.execute("cuda_values()", want_value=True)[0])
        pool.stop()
    else:
        [value] = notebook_launcher(cuda_values, num_processes=1, show_progress=False)
    print("devices:", describe(value), flush=True)
    print("initialized:", torch.cuda.is_initialized(), flush=True)
    print("works after fork:", cuda_facts.cuda_works_after_fork(), flush=True)
    launch(start_method="fork")  # the next fork launch still works
"""


def _returns_cuda(tmp_path: Path, which: str) -> str:
    script = tmp_path / "kernel.py"
    script.write_text(PRELUDE + RETURNS_CUDA)
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_NVML_BASED_CUDA_CHECK"}
    done = subprocess.run(
        [sys.executable, str(script), which],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.timeout(300)
def test_cuda_tensors_in_a_distributed_cell_value_reach_the_kernel_on_the_cpu(
    tmp_path: Path,
) -> None:
    out = _returns_cuda(tmp_path, "pool")
    assert "devices: ['cpu']" in out
    assert "initialized: False" in out and "works after fork: True" in out
    assert "result: cpu 1.0" in out


@pytest.mark.timeout(300)
def test_cuda_tensors_in_a_returned_dataclass_reach_the_kernel_on_the_cpu(tmp_path: Path) -> None:
    out = _returns_cuda(tmp_path, "launch")
    assert "devices: ['cpu']" in out
    assert "initialized: False" in out and "works after fork: True" in out
    assert "result: cpu 1.0" in out


NVML_REPORT = """
if __name__ == "__main__":
    from nb_accel.runtime.device_types import cuda_facts, nvml
    report = nvml.gpu_report()
    print("works after fork:", cuda_facts.cuda_works_after_fork(), flush=True)  # CUDA left alone
    print("count:", len(report.gpus) == cuda_facts.cuda_device_count(), flush=True)
    print("driver:", bool(report.driver), flush=True)
    capabilities = [gpu.capability for gpu in report.gpus]
    torch_says = [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]
    print("capabilities:", sorted(capabilities) == sorted(torch_says), flush=True)
"""


@pytest.mark.timeout(300)
def test_nvml_reports_what_cuda_would_without_initialising_it(tmp_path: Path) -> None:
    out = _kernel(tmp_path, NVML_REPORT).stdout
    assert "works after fork: True" in out
    assert "count: True" in out and "driver: True" in out and "capabilities: True" in out


STALE_NCCL_COLLECTIVE = """
import signal, threading, time
from pathlib import Path

CELL = '''
import time, torch, torch.distributed as dist
if rank == 0:
    dist.all_reduce(torch.full((1,), 100.0, device="cuda"))  # queued; rank 1 never joins
open(f"{marker}.{rank}", "w").close()
time.sleep(60)
'''
SUM = '''
value = torch.full((1,), float(rank + 1), device="cuda")
dist.all_reduce(value)
value.item()
'''


def interrupt_when(marker):
    # once rank 0 has queued its all-reduce and both ranks are in the cell's sleep
    while not all(Path(f"{marker}.{rank}").exists() for rank in (0, 1)):
        time.sleep(0.02)
    os.kill(os.getpid(), signal.SIGINT)


if __name__ == "__main__":
    from nb_accel.launch.pool import WorkerPool, load_value
    marker = Path(sys.argv[1])
    pool = WorkerPool(2, timeout=60)
    pool.start()
    pool.push({"marker": str(marker)})
    threading.Thread(target=interrupt_when, args=(marker,), daemon=True).start()
    try:
        pool.execute(CELL)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    done = pool.execute(SUM, want_value=True)
    print("sums:", [load_value(done[r]) for r in sorted(done)], flush=True)
    pool.stop()
"""


@pytest.mark.skipif(cuda_facts.cuda_device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.timeout(300)
def test_a_queued_nccl_collective_does_not_pair_with_the_next_cell(tmp_path: Path) -> None:
    script = tmp_path / "kernel.py"
    script.write_text(PRELUDE + STALE_NCCL_COLLECTIVE)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "inside")],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "interrupted" in done.stdout and "sums: [3.0, 3.0]" in done.stdout
    assert "The process group was remade" in done.stderr


TENSOR_AFTER_IMPORT = """
import nb_accel


def load_model():
    return torch.zeros(1, device="cuda")  # line 29 of the script: CUDA initialised here


if __name__ == "__main__":
    load_model()
    launch(start_method="fork")   # refused, naming the line
    launch()                      # falls back, naming it too
"""


@pytest.mark.timeout(300)
def test_the_line_that_initialised_cuda_is_named(tmp_path: Path) -> None:
    done = _kernel(tmp_path, TENSOR_AFTER_IMPORT)
    named = "by the first use of CUDA at kernel.py, line "
    assert named in done.stdout and named in done.stderr, done.stdout + done.stderr
    assert "reached from" not in done.stdout
