"""A rank whose process is stopped (SIGSTOP, Ctrl-Z: frozen, not dead) while the others wait
for it: it can say nothing and take no interrupt. A cold launch ends at the collective timeout
saying the rank was frozen; a pool ends it and replaces it, the others keeping their
variables; a ``max_restarts`` run restarts at once instead of waiting out torch's 30 s grace
for the frozen worker's SIGTERM. Found by the chaos campaign (``tests/chaos``: seed 7, each
style with ``sigstop``)."""

from __future__ import annotations

import os
import signal

import pytest
import torch
import torch.distributed as dist
from markers import interrupted_unless_done

from nb_accel import notebook_launcher
from nb_accel.errors import CollectiveTimeoutError, WorkerDiedError
from nb_accel.launch.pool import WorkerPool
from nb_accel.launch.pool_ranks.values import load_value

TIMEOUT_S = 3
#: Past the timeout, the bound on each run here (a frozen rank once held a pool 10 s more,
#: and a restart 30 s more).
BOUND_S = 20


def freezes_rank_1() -> int:
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.barrier()
    if dist.get_rank() == 1 and attempt == 0:
        os.kill(os.getpid(), signal.SIGSTOP)
    dist.all_reduce(torch.ones(1))
    return attempt


@pytest.mark.timeout(60)
def test_a_cold_launch_says_the_rank_was_frozen() -> None:
    with (
        interrupted_unless_done("the launch ending at the timeout", BOUND_S),
        pytest.raises(CollectiveTimeoutError) as info,
    ):
        notebook_launcher(freezes_rank_1, num_processes=2, timeout=TIMEOUT_S)
    assert "Rank 1 did not arrive (was frozen: its process was stopped" in str(info.value)


@pytest.mark.timeout(60)
def test_a_restart_does_not_wait_for_the_frozen_worker() -> None:
    with interrupted_unless_done("the restart after the timeout", BOUND_S):
        attempts = notebook_launcher(
            freezes_rank_1, num_processes=2, timeout=TIMEOUT_S, max_restarts=1
        )
    assert attempts == [1, 1]


FREEZES_IN_A_CELL = """
import os, signal
import torch
import torch.distributed as dist
if rank == 1:
    os.kill(os.getpid(), signal.SIGSTOP)
dist.all_reduce(torch.ones(1))
"""


@pytest.mark.timeout(60)
def test_a_pool_ends_and_replaces_a_frozen_rank() -> None:
    pool = WorkerPool(2, cpu=True, timeout=TIMEOUT_S)
    pool.start()
    try:
        pool.execute("kept = rank")
        before = [status.pid for status in pool.status()]
        with (
            interrupted_unless_done("the cell ending at the timeout", BOUND_S),
            pytest.raises(WorkerDiedError) as info,
        ):
            pool.execute(FREEZES_IN_A_CELL)
        assert "worker for rank 1" in str(info.value) and "was frozen" in str(info.value)
        assert "Rank 1 died and was replaced by a new process" in "\n".join(info.value.__notes__)
        after = [status.pid for status in pool.status()]
        assert after[0] == before[0] and after[1] != before[1]
        done = pool.execute("'kept' in globals()", want_value=True)
        assert [load_value(done[r]) for r in sorted(done)] == [True, False]
    finally:
        pool.stop()
