"""A rank still in its own code when another fails ends there, in every way of running ranks.

One rank sleeps for ten minutes (its own code, not a collective) while the other waits for it in
``all_reduce`` with a 3 s timeout, or raises: a cold launch, a warm launch and a
``%%distributed`` cell each end with the same verdict, naming where the late rank was, instead
of waiting for its sleep to end (the tests' own timeout is far below it). Warm workers and the
pool keep the late rank's variables: its interrupt stops the command, not the process. Under torch's
elastic agent the late rank is located before the agent stops the group.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from markers import interrupted_unless_done
from shown_rows import ShownRows

from nb_accel import notebook_launcher, stop_workers
from nb_accel.errors import CollectiveTimeoutError
from nb_accel.launch.driver import driver as driver_module
from nb_accel.launch.pool import WorkerPool
from nb_accel.launch.pool_ranks.values import load_value

#: Far beyond every test's own timeout: only an interrupt ends the late rank's wait.
SLEEP_S = 600
TEST_TIMEOUT_S = 60
#: How long a pool's cell may take to fail with its 3 s timeout (seconds): a bound against
#: hanging, leaving the interrupt's grace within the test's own.
FREED_S = 20


def late_rank(timeout_reached: bool) -> int:
    """Rank 1 sleeps; rank 0 waits for it in a collective (or raises at once)."""
    rank = dist.get_rank()
    if rank == 1:
        time.sleep(SLEEP_S)
    elif not timeout_reached:
        raise ValueError("rank 0 gave up")
    dist.all_reduce(torch.ones(1))
    return rank


@pytest.fixture
def warm_workers_stopped() -> Iterator[None]:
    """The warm workers a test started are stopped after it."""
    yield None
    stop_workers()


def _timeout_message(style: str) -> str:
    options = {"cold": {}, "warm": {"reuse_workers": True}, "agent": {"max_restarts": 1}}
    with pytest.raises(CollectiveTimeoutError) as info:
        notebook_launcher(late_rank, args=(True,), num_processes=2, timeout=3, **options[style])
    return str(info.value)


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("style", ["cold", "warm", "agent"])
def test_a_late_rank_in_its_own_code_is_named_where_it_was(
    style: str, warm_workers_stopped: None
) -> None:
    """Under torch's elastic agent (``max_restarts``) the group is restarted once, then the
    agent stops it: the late rank is located before it is."""
    message = _timeout_message(style)
    assert "A collective timed out after 3 s on rank 0 of 2" in message, message
    assert "Rank 1 did not arrive (was still running, at `late_rank` (" in message, message
    sleep_line = late_rank.__code__.co_firstlineno + 4  # its time.sleep
    assert f"test_late_ranks.py, line {sleep_line})" in message, message
    assert "gave up" not in message  # the late rank's own end is not a cause


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_warm_late_rank_is_interrupted_and_its_workers_stay(warm_workers_stopped: None) -> None:
    _timeout_message("warm")
    again = notebook_launcher(dist.get_world_size, num_processes=2, timeout=3, reuse_workers=True)
    assert again == [2, 2]  # the same two workers, their process group made anew


CELL = """
import time, torch, torch.distributed as dist
def late():
    if rank == 1:
        time.sleep({sleep})
    elif not {timeout_reached}:
        raise ValueError("rank 0 gave up")
    dist.all_reduce(torch.ones(1))
late()
"""


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_pool_s_late_rank_is_interrupted_keeping_its_variables() -> None:
    pool = WorkerPool(2, cpu=True, timeout=3)
    pool.start()
    shown = ShownRows()
    try:
        pool.execute("kept = rank * 10")
        cell = CELL.format(sleep=SLEEP_S, timeout_reached=True)
        freed = "rank 0's own 3 s deadline freeing its wait (the cell failing with it)"
        with interrupted_unless_done(freed, FREED_S):
            with pytest.raises(CollectiveTimeoutError) as info:
                pool.execute(cell, name="Cell In[4]", view=shown)
        message = str(info.value)
        assert "Rank 1 did not arrive (was still running, at `late` (Cell In[4], line 5)" in (
            message
        ), message
        assert shown.rows[1] == ("stopped", "rank 0 failed"), shown.rows
        done = pool.execute("kept", want_value=True)
        assert [load_value(done[rank]) for rank in sorted(done)] == [0, 10]
    finally:
        pool.stop()


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_pool_s_late_rank_is_stopped_by_another_s_error() -> None:
    pool = WorkerPool(2, cpu=True, timeout=10 * TEST_TIMEOUT_S)
    pool.start()
    try:
        cell = CELL.format(sleep=SLEEP_S, timeout_reached=False)
        with pytest.raises(ValueError, match="rank 0 gave up") as info:
            pool.execute(cell)
        notes = "\n".join(info.value.__notes__)
        assert "Raised on rank 0 of 2" in notes, notes
        assert "Rank 1 was interrupted by this failure and kept its variables." in notes, notes
        assert "KeyboardInterrupt" not in notes
        assert pool.running
    finally:
        pool.stop()


IGNORES_INTERRUPTS = """
import time
from collections.abc import Iterator
if rank == 1:
    while True:
        try:
            time.sleep({sleep})
        except KeyboardInterrupt:
            pass
raise ValueError("rank 0 gave up")
"""


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_late_rank_that_ignores_its_interrupt_has_the_pool_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(driver_module, "INTERRUPT_GRACE_S", 2.0)  # the driver's grace, shortened
    pool = WorkerPool(2, cpu=True, timeout=10 * TEST_TIMEOUT_S)
    pool.start()
    try:
        with pytest.raises(KeyboardInterrupt) as info:
            pool.execute(IGNORES_INTERRUPTS.format(sleep=SLEEP_S))
        message = str(info.value)
        assert "rank(s) [1] did not stop within 2 s of the interrupt after another rank" in (
            message
        ), message
        assert "%distributed restart starts it again" in message
        assert not pool.running
    finally:
        pool.stop()
