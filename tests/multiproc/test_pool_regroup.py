"""%%distributed after a cell interrupted inside a collective: the collective left queued on one
rank would pair with the next cell's, so the pool's workers rebuild their process group first
(and only then: a failure that leaves every rank's collectives matched keeps the group).

A rank interrupted while another waits inside a collective with it frees that one (it releases
its process group): under a collective timeout ten times the test's own, the interrupt ends the
cell on every rank within the pool's grace, or the pool is stopped and the test fails."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from markers import touch_when_waiting

from nb_accel.launch.pool import WorkerPool
from nb_accel.launch.pool_ranks.values import load_value

#: Rank 0 enters all_reduces that rank 1 never joins; the kernel is interrupted once rank 0
#: waits inside the second (and rank 1 in its sleep).
INSIDE_A_COLLECTIVE = """
import time
import torch
import torch.distributed as dist
if rank == 0:
    dist.all_reduce(torch.full((1,), 100.0), async_op=True)
    touch_when_waiting(marker)
    dist.all_reduce(torch.full((1,), 100.0))  # waits here when the interrupt comes
else:
    open(marker + ".1", "w").close()
    time.sleep(60)
"""

#: Rank 0 waits on a collective's handle (inside that C++ call when the interrupt comes): its
#: stack ends in the cell's line, so the kernel cannot tell it waits in a collective (gloo's
#: flight recorder does not say when one finishes), and only the collective timeout ends it.
WAITING_ON_A_HANDLE = """
import time
import torch
import torch.distributed as dist
if rank == 0:
    work = dist.all_reduce(torch.full((1,), 100.0), async_op=True)
    touch_when_waiting(marker, in_python=False)
    work.wait()
else:
    open(marker + ".1", "w").close()
    time.sleep(60)
"""

#: The test's own bound (seconds), and a collective timeout far above it.
TEST_TIMEOUT_S = 60
COLLECTIVE_TIMEOUT_S = 10 * TEST_TIMEOUT_S
#: The timeout that ends rank 0's wait on the handle.
HANDLE_TIMEOUT_S = 3

SUM_OF_RANKS = """
value = torch.full((1,), float(rank + 1))
dist.all_reduce(value)
value.item()
"""


def _interrupt_when(marker: Path, deadline: float) -> None:
    """Interrupt this process (as Kernel → Interrupt does) once rank 0's ``marker`` and rank
    1's exist."""
    markers = (marker, marker.with_name(marker.name + ".1"))
    while not all(m.exists() for m in markers) and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(os.getpid(), signal.SIGINT)


def _sum_of_ranks(pool: WorkerPool) -> list[float]:
    done = pool.execute(SUM_OF_RANKS, want_value=True)
    return [load_value(done[rank]) for rank in sorted(done)]


@pytest.mark.parametrize(
    ("cell", "timeout"),
    [(INSIDE_A_COLLECTIVE, COLLECTIVE_TIMEOUT_S), (WAITING_ON_A_HANDLE, HANDLE_TIMEOUT_S)],
    ids=["inside-a-collective", "waiting-on-a-handle"],
)
@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_the_next_cell_after_an_interrupted_collective_computes_the_right_sum(
    cell: str, timeout: float, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pool = WorkerPool(2, cpu=True, timeout=timeout)
    pool.start()
    marker = tmp_path / "inside"
    interrupter = threading.Thread(target=_interrupt_when, args=(marker, time.monotonic() + 30))
    try:
        pool.push({"marker": str(marker), "touch_when_waiting": touch_when_waiting})
        interrupter.start()
        with pytest.raises(KeyboardInterrupt) as info:
            pool.execute(cell)
        interrupter.join()
        assert marker.exists(), "rank 0 was not waiting in the collective when interrupted"
        assert "did not stop" not in str(info.value), info.value  # freed, not given up on
        assert pool.running, (info.value.__cause__, getattr(info.value, "__notes__", None))
        capsys.readouterr()
        assert _sum_of_ranks(pool) == [3.0, 3.0]
        err = capsys.readouterr().err
        assert err.count("The process group was remade") == 1
        assert _sum_of_ranks(pool) == [3.0, 3.0]  # and it stays right
        assert "remade" not in capsys.readouterr().err
    finally:
        if interrupter.is_alive():
            interrupter.join()
        pool.stop()


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_failure_with_matched_collectives_keeps_the_process_group(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pool = WorkerPool(2, cpu=True, timeout=COLLECTIVE_TIMEOUT_S)
    pool.start()
    try:
        pool.execute("import torch, torch.distributed as dist\ngroup = dist.group.WORLD")
        with pytest.raises(KeyError):
            pool.execute("if rank == 1:\n    raise KeyError('missing column')")
        assert _sum_of_ranks(pool) == [3.0, 3.0]
        [same] = load_value(pool.execute("[dist.group.WORLD is group]", [0], True)[0])
        assert same is True
        assert "remade" not in capsys.readouterr().err
    finally:
        pool.stop()
