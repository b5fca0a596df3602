"""Where a rank is: a collective timeout names the function the missing rank was in (its
stack, taken without stopping it), under fork and spawn."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.distributed as dist

from nb_accel import notebook_launcher
from nb_accel.errors import CollectiveTimeoutError

pytestmark = pytest.mark.timeout(120)


def stuck_here_forever(release: threading.Event) -> None:
    while not release.is_set():
        release.wait(0.05)


def train() -> None:
    if dist.get_rank() == 1:
        stuck_here_forever(threading.Event())  # nobody sets it: only the launch's end stops it
    dist.all_reduce(torch.ones(1))


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_timeout_says_where_the_missing_rank_is(start_method: str) -> None:
    with pytest.raises(CollectiveTimeoutError) as info:
        notebook_launcher(train, num_processes=2, timeout=3, start_method=start_method)
    message = str(info.value)
    assert "Rank 1 did not arrive (was still running, at `stuck_here_forever` (" in message
    assert "test_whereabouts.py, line" in message and "← `train` (line" in message
