"""In a real kernel, what workers write below Python (C libraries, ``os.write``) is cell output
with the rank's prefix, and NCCL's watchdog abort is a ``CollectiveTimeoutError``."""

from __future__ import annotations

import pytest
from kernel_driver import run_cell, running_kernel

BELOW_PYTHON = """
from nb_accel import notebook_launcher

def below_python():
    import ctypes, os
    import torch.distributed as dist
    rank = dist.get_rank()
    os.write(2, f"from C on rank {rank}\\n".encode())
    ctypes.CDLL(None).printf(b"printf on rank %d\\n", ctypes.c_int(rank))
    ctypes.CDLL(None).fflush(None)

notebook_launcher(below_python, num_processes=2);
"""

WATCHDOG = """
def watchdog_aborts_rank_one():
    import os, time
    import torch.distributed as dist
    if dist.get_rank() == 1:
        os.write(2, b"[Rank 1] Watchdog caught collective operation timeout: "
                    b"WorkNCCL(SeqNum=2, OpType=ALLGATHER, Timeout(ms)=9000) "
                    b"ran for 9001 milliseconds before timing out.\\n")
        os.abort()
    time.sleep(60)

notebook_launcher(watchdog_aborts_rank_one, num_processes=2, timeout=9)
"""


@pytest.mark.timeout(180)
def test_native_output_is_cell_output_with_the_rank() -> None:
    with running_kernel() as (_, client):
        run = run_cell(client, BELOW_PYTHON)
        assert run.status == "ok", run.traceback
        for rank in (0, 1):
            assert f"[rank {rank}] from C on rank {rank}\n" in run.stderr
            assert f"[rank {rank}] printf on rank {rank}\n" in run.stdout


@pytest.mark.timeout(180)
def test_an_nccl_watchdog_abort_is_raised_as_a_collective_timeout() -> None:
    with running_kernel() as (_, client):
        run_cell(client, "from nb_accel import notebook_launcher")
        run = run_cell(client, WATCHDOG)
        assert run.ename == "CollectiveTimeoutError"
        assert "timed out after 9 s on rank 1 of 2" in run.evalue
        assert "OpType=ALLGATHER" in run.evalue
        assert "[rank 1] [Rank 1] Watchdog caught collective operation timeout" in run.stderr
