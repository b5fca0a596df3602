"""The rendezvous store of a launch waits as long as the launch's ``timeout``, not torch's 300 s.

NCCL exchanges its communicator's id through this store, so a rank that reaches the first
collective late (rank 0 downloading a model inside ``main_process_first()``) is waited for as
long as the launch allows; a wait that cannot succeed gives up after the same time.
"""

from __future__ import annotations

import pytest

from nb_accel import CollectiveTimeoutError, notebook_launcher


def store_timeout() -> float:
    from torch.distributed import distributed_c10d

    return float(distributed_c10d._get_default_store().timeout.total_seconds())


def wait_for_a_key_nobody_sets() -> None:
    from torch.distributed import distributed_c10d

    distributed_c10d._get_default_store().wait(["never set by any rank"])


def test_the_store_waits_as_long_as_the_launch_timeout() -> None:
    assert notebook_launcher(store_timeout, num_processes=2, timeout=1234) == [1234.0, 1234.0]


@pytest.mark.timeout(90)
def test_a_wait_on_the_store_gives_up_after_the_launch_timeout_not_torchs_default() -> None:
    # With torch's default the wait would last 300 s and this test would time out.
    with pytest.raises(CollectiveTimeoutError, match=r"timed out after 3 s on ranks 0, 1 of 2"):
        notebook_launcher(wait_for_a_key_nobody_sets, num_processes=2, timeout=3)
