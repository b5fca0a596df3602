"""Launches in a real Jupyter kernel, with its garbage collector off, leave the kernel's open
file descriptors and threads where they were: 20 that succeed, failures shown as the cell's
error, an interrupted one; and a launch leaves nothing of nb_accel in reference cycles."""

from __future__ import annotations

import pytest
from jupyter_client import KernelManager
from jupyter_client.blocking import BlockingKernelClient
from kernel_driver import CellRun, collect, run_cell, running_kernel, start_cell

#: Launches that succeed, measured together.
REPEATS = 20
#: Launches whose failure is the cell's error (each a cell of its own).
FAILURES = 3

SETUP = """
import gc, os, threading
import torch.distributed as dist
from nb_accel import notebook_launcher

def returns_rank():
    return dist.get_rank()

def rank_one_raises():
    if dist.get_rank() == 1:
        raise ValueError("rank 1 gave up")
    dist.barrier()  # rank 0 waits here until the launch stops it

def waits_for_the_interrupt():
    print(f"rank {dist.get_rank()} waits", flush=True)
    threading.Event().wait(120)

def kernel_state():
    return len(os.listdir("/proc/self/fd")), threading.active_count()

gc.collect()
gc.disable()  # what a launch leaves open must have been closed without the collector
assert notebook_launcher(returns_rank, num_processes=2, cpu=True) == [0, 1]  # warm-up
"""

SUCCEEDING = f"""
for _ in range({REPEATS}):
    assert notebook_launcher(returns_rank, num_processes=2, cpu=True) == [0, 1]
"""

FAILING = "notebook_launcher(rank_one_raises, num_processes=2, cpu=True)"

INTERRUPTED = "notebook_launcher(waits_for_the_interrupt, num_processes=2, cpu=True)"

STATE = 'print("kernel state:", *kernel_state(), "collector on:", gc.isenabled())'

CYCLES = """
gc.collect()
gc.set_debug(gc.DEBUG_SAVEALL)  # the collector keeps what it frees, to be looked at
try:
    notebook_launcher(returns_rank, num_processes=2, cpu=True)
    gc.collect()
    kept = {type(o).__module__ + "." + type(o).__qualname__ for o in gc.garbage}
    print("left in cycles:", sorted(name for name in kept if name.startswith("nb_accel")))
finally:
    gc.set_debug(0)
    gc.garbage.clear()
"""


def _fails(client: BlockingKernelClient) -> None:
    """A cell whose launch fails: the kernel shows the worker's error, without our frames."""
    run = run_cell(client, FAILING)
    assert (run.status, run.ename, run.evalue) == ("error", "ValueError", "rank 1 gave up")
    traceback = "\n".join(run.traceback)
    assert "Traceback from rank 1" in traceback and "Raised on rank 1 of 2" in traceback
    assert "launcher.py" not in traceback  # rendered by nb_accel's hook: the user's frames only


def _interrupted(client: BlockingKernelClient, manager: KernelManager) -> None:
    """A cell whose launch is interrupted once both ranks wait in the function."""
    msg_id = start_cell(client, INTERRUPTED)
    collect(client, msg_id, until=("rank 0 waits", "rank 1 waits"))
    manager.interrupt_kernel()
    run = collect(client, msg_id)
    assert (run.status, run.ename) == ("error", "KeyboardInterrupt")


def _state(run: CellRun) -> tuple[int, int]:
    """The kernel's open descriptors and threads, as the ``STATE`` cell printed them."""
    line = next(line for line in run.stdout.splitlines() if line.startswith("kernel state:"))
    fds, threads, _, _, enabled = line.removeprefix("kernel state: ").split()
    assert enabled == "False", "the collector must stay off"
    return int(fds), int(threads)


@pytest.mark.timeout(300)
def test_launches_in_a_kernel_leave_its_descriptors_and_threads_as_they_were() -> None:
    with running_kernel() as (manager, client):
        setup = run_cell(client, SETUP)
        assert setup.status == "ok", setup.traceback
        _fails(client)  # warm-up: what showing the first error loads
        _interrupted(client, manager)
        before = _state(run_cell(client, STATE))
        launches = run_cell(client, SUCCEEDING)
        assert launches.status == "ok", launches.traceback
        assert _state(run_cell(client, STATE)) == before, "after the succeeding launches"
        for _ in range(FAILURES):
            _fails(client)
        _interrupted(client, manager)
        assert _state(run_cell(client, STATE)) == before, "after the failures and the interrupt"
        cycles = run_cell(client, CYCLES)
        assert cycles.status == "ok", cycles.traceback
        assert "left in cycles: []" in cycles.stdout, cycles.stdout
