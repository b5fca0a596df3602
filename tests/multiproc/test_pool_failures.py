"""A failing ``%%distributed`` cell: the failing rank is the cause, ranks left waiting for it are
shown stopped by it."""

from __future__ import annotations

import pytest
from shown_rows import ShownRows

from nb_accel.launch.pool import WorkerPool

CELL = """
import torch
import torch.distributed as dist
if rank == 1:
    undefined_name
dist.all_reduce(torch.ones(1))  # the other ranks wait here for rank 1 until the timeout
"""


@pytest.mark.timeout(120)
def test_a_rank_that_timed_out_waiting_for_a_failed_rank_is_shown_stopped() -> None:
    pool = WorkerPool(3, cpu=True, timeout=3)
    pool.start()
    shown = ShownRows()
    try:
        with pytest.raises(NameError, match="undefined_name") as info:
            pool.execute(CELL, view=shown)
        assert pool.running  # the workers live on
    finally:
        pool.stop()
    notes = "\n".join(info.value.__notes__)
    assert "Raised on rank 1 of 3" in notes
    assert "Ranks 0, 2 were stopped by this failure." in notes
    assert "Other failures" not in notes and "imed out" not in notes
    assert shown.rows == {
        1: ("failed", "NameError: name 'undefined_name' is not defined"),
        0: ("stopped", "rank 1 failed"),
        2: ("stopped", "rank 1 failed"),
    }
