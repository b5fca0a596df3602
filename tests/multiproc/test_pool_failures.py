"""A failing ``%%distributed`` cell: the failing rank is the cause, and it frees the ranks left
waiting for it in a collective at once, which are shown stopped by it.

The collective timeout is far above the test's own timeout: a rank left waiting is freed by
the failed rank releasing its process group, or the test fails; the timeout never does it."""

from __future__ import annotations

import pytest
from shown_rows import ShownRows

from nb_accel.errors import WorkerFailure, is_peer_loss
from nb_accel.launch.pool import WorkerPool

#: The test's own bound (seconds); the pool's collective timeout is ten times that.
TEST_TIMEOUT_S = 60
COLLECTIVE_TIMEOUT_S = 10 * TEST_TIMEOUT_S

CELL = """
import torch
import torch.distributed as dist
if rank == 1:
    undefined_name
dist.all_reduce(torch.ones(1))  # the other ranks wait here until rank 1's failure frees them
"""


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_failed_rank_frees_the_ranks_waiting_for_it_and_they_are_shown_stopped() -> None:
    pool = WorkerPool(3, cpu=True, timeout=COLLECTIVE_TIMEOUT_S)
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
    # what freed the waiting ranks: their collective failed because rank 1 went away
    records: list[WorkerFailure] = info.value.nb_accel_failures  # type: ignore[attr-defined]
    freed = {record.rank: record.message for record in records if record.rank != 1}
    assert sorted(freed) == [0, 2], records
    assert all(is_peer_loss(message) for message in freed.values()), freed
    assert shown.rows == {
        1: ("failed", "NameError: name 'undefined_name' is not defined"),
        0: ("stopped", "rank 1 failed"),
        2: ("stopped", "rank 1 failed"),
    }
