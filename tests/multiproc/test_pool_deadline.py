"""A persistent pool's ranks keep its collective timeout themselves: past it, a rank frees its
own wait (gloo's connections shut down), the cell fails with the timeout, and the next cell
runs on a rebuilt process group.

Both ranks wait in collectives that can never match (an all_reduce and a recv): only the
ranks' own deadlines can end the cell, torch's is days away."""

from __future__ import annotations

import pytest
from markers import interrupted_unless_done

from nb_accel.errors import CollectiveTimeoutError
from nb_accel.launch.pool import WorkerPool
from nb_accel.launch.pool_ranks.values import load_value
from nb_accel.worker.debugging.deadline import FAR_TIMEOUT

NEVER_MATCHED = """
import torch
import torch.distributed as dist
if rank == 0:
    dist.all_reduce(torch.ones(1))
else:
    dist.recv(torch.ones(1), src=0)
"""

SUM_OF_RANKS = """
value = torch.full((1,), float(rank + 1))
dist.all_reduce(value)
value.item()
"""

#: How long the cell may take to fail with the 2 s timeout (seconds): a bound against hanging,
#: leaving the interrupt's grace within the test's own.
FREED_S = 20

#: The deadline torch holds the default group's collectives to (its gloo backend's).
TORCHS_TIMEOUT = (
    "dist.distributed_c10d._get_default_group()._get_backend(torch.device('cpu'))"
    ".options._timeout.total_seconds()"
)


@pytest.mark.timeout(60)
def test_ranks_past_the_pools_timeout_free_themselves_and_the_pool_goes_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pool = WorkerPool(2, cpu=True, timeout=2)
    pool.start()
    try:
        freed = "the ranks' own 2 s deadline freeing their waits (the cell failing with it)"
        with interrupted_unless_done(freed, FREED_S):
            with pytest.raises(CollectiveTimeoutError) as info:
                pool.execute(NEVER_MATCHED)
        message = str(info.value)  # the first deadline to pass frees the other rank too
        assert "timed out after 2 s on rank" in message, message
        assert "gave up" in message or "ranks 0, 1 of 2" in message, message
        assert pool.running
        capsys.readouterr()
        done = pool.execute(SUM_OF_RANKS, want_value=True)
        assert [load_value(done[rank]) for rank in sorted(done)] == [3.0, 3.0]
        assert "The process group was remade" in capsys.readouterr().err
        # the rebuilt group leaves the deadline to the ranks too
        seconds = load_value(pool.execute(TORCHS_TIMEOUT, [0], want_value=True)[0])
        assert seconds == FAR_TIMEOUT.total_seconds()
    finally:
        pool.stop()
