"""A failing ``%%distributed`` cell: the failing rank is the cause, and it frees the ranks left
waiting for it in a collective at once, which are shown stopped by it; a rank that dies is
replaced by a new process, and the others keep their variables.

The collective timeout is far above the test's own timeout: a rank left waiting is freed by
the failed rank releasing its process group, or the test fails; the timeout never does it."""

from __future__ import annotations

import os
import signal

import pytest
from markers import interrupted_unless_done
from shown_rows import ShownRows

from nb_accel.errors import WorkerDiedError, WorkerFailure, is_peer_loss
from nb_accel.launch.pool import WorkerPool
from nb_accel.launch.pool_ranks.local import LocalRanks
from nb_accel.launch.pool_ranks.values import load_value

#: The test's own bound (seconds); the pool's collective timeout is ten times that.
TEST_TIMEOUT_S = 60
COLLECTIVE_TIMEOUT_S = 10 * TEST_TIMEOUT_S
#: How long a killed rank's replacement may take to join the others, cell and all (seconds): a
#: bound against hanging, leaving the interrupt's grace within the test's own.
REPLACED_S = 20

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
    assert "Ranks 0, 2 were interrupted by this failure and kept their variables." in notes
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


KILLED_IN_A_COLLECTIVE = """
import os, signal
import torch
import torch.distributed as dist
from nb_accel import resident
built = resident("built", list)
built.append(rank)
if rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
dist.all_reduce(torch.ones(1))  # the other ranks wait here: rank 1's death frees them
"""

WHOLE_AGAIN = """
import torch
import torch.distributed as dist
from nb_accel import resident
total = torch.ones(1)
dist.all_reduce(total)
(total.item(), "kept" in globals(), len(resident("built", list)))
"""


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_killed_rank_is_replaced_and_the_others_keep_their_variables(start_method: str) -> None:
    pool = WorkerPool(3, cpu=True, timeout=COLLECTIVE_TIMEOUT_S, start_method=start_method)
    pool.start()
    shown = ShownRows()
    try:
        pool.execute("kept = rank")
        before = [status.pid for status in pool.status()]
        # The new rank 1 waits for the others to make the process group anew with it: until
        # they do, it answers nothing (the cell's error waits for it, and so does the next).
        joined = "the new rank 1 joining the process group the others make anew"
        with interrupted_unless_done(joined, REPLACED_S):
            with pytest.raises(
                WorkerDiedError, match=r"rank 1 \(pid \d+\) was killed by SIGKILL"
            ) as info:
                pool.execute(KILLED_IN_A_COLLECTIVE, view=shown)
            assert pool.running  # whole again, with a new process for rank 1
            after = [status.pid for status in pool.status()]
            assert after[0] == before[0] and after[2] == before[2] and after[1] != before[1]
            done = pool.execute(WHOLE_AGAIN, want_value=True)
        values = [load_value(reply) for _, reply in sorted(done.items())]
        where = pool.where()  # the new process's stacks, under its own main thread
        assert sorted(where) == [0, 1, 2] and all(s.idle for s in where.values()), where
    finally:
        pool.stop()
    notes = "\n".join(info.value.__notes__)
    assert f"Rank 1 died and was replaced by a new process (pid {after[1]})" in notes
    assert "(not by the out-of-memory killer, whose count of kills did not change" in str(
        info.value
    )
    assert "The variables rank 1 held are gone (the other ranks kept theirs)" in notes
    assert "Ranks 0, 2 were interrupted by this failure and kept their variables." in str(
        info.value
    )
    assert shown.rows[0] == ("stopped", "rank 1 failed")
    # the new rank 1 joined the group; its namespace and residents start afresh
    assert values == [(3.0, True, 1), (3.0, False, 0), (3.0, True, 1)]


RAISES_AFTER_PREPARE = """
import torch
import torch.distributed as dist
from nb_accel import Accelerator
accelerator = Accelerator(cpu=True)
model = accelerator.prepare(torch.nn.Linear(4, 1))  # DDP: it holds the process group
if rank == 1:
    raise ValueError("rank 1 gave up")
dist.all_reduce(torch.ones(1))  # rank 0 waits here until rank 1's release frees it
"""


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_failed_rank_whose_group_a_model_holds_still_frees_the_others() -> None:
    pool = WorkerPool(2, cpu=True, timeout=COLLECTIVE_TIMEOUT_S)
    pool.start()
    try:
        freed = (
            "rank 0 freed from its all_reduce by rank 1's failure (a DDP model holding the group)"
        )
        with interrupted_unless_done(freed, 20), pytest.raises(ValueError) as info:
            pool.execute(RAISES_AFTER_PREPARE)
        notes = "\n".join(info.value.__notes__)
        assert "Rank 0 was interrupted by this failure and kept its variables." in notes, notes
        assert pool.execute("rank", want_value=True)  # the pool goes on
    finally:
        pool.stop()


IGNORES_ITS_INTERRUPT = """
import pathlib, time
import torch
import torch.distributed as dist
looping = pathlib.Path({folder!r}, "rank-1-looping")
if rank == 0:
    while not looping.exists():
        time.sleep(0.01)
    raise ValueError("rank 0 gave up")
try:  # as a debugger's prompt does, the interrupt is taken and the rank goes on
    looping.touch()
    while True:
        time.sleep(0.01)
except KeyboardInterrupt:
    pass
dist.all_reduce(torch.ones(1))  # waits for rank 0, which failed: its release frees this
"""


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_rank_that_reaches_a_collective_after_its_interrupt_is_freed(tmp_path) -> None:
    """Found by the chaos campaign (seed 1005, a ``%%distributed`` cell whose rank 1 sat at a
    ``breakpoint()`` prompt while rank 0 raised): the rank in its own code was interrupted,
    the prompt took the interrupt, and once answered the rank waited in a collective with the
    failed rank until the timeout. The pool now looks again, and frees it."""
    pool = WorkerPool(2, cpu=True, timeout=COLLECTIVE_TIMEOUT_S)
    pool.start()
    try:
        freed = "rank 1 freed from the all_reduce it reached after its interrupt"
        with interrupted_unless_done(freed, 8), pytest.raises(ValueError) as info:
            pool.execute(IGNORES_ITS_INTERRUPT.format(folder=str(tmp_path)))
        notes = "\n".join(info.value.__notes__)
        assert "Rank 1 was interrupted by this failure and kept its variables." in notes, notes
        assert pool.execute("rank", want_value=True)  # the pool goes on
    finally:
        pool.stop()


SLEEPS = "import time\ntime.sleep(600)  # until the interrupt"
ALL_REDUCE = (
    "import torch, torch.distributed as dist\ntotal = torch.ones(1)\ndist.all_reduce(total)\n"
    "total.item()"
)


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_an_interrupt_that_comes_while_a_cell_is_sent_stops_it_on_every_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kernel's interrupt lands after the cell reached rank 0 and before rank 1 (chaos
    seed 8, cell / interrupt at start-up): the cell still reaches rank 1, and it is stopped on
    both ranks, before it starts or in it. It used to stay running on rank 0, never sent to
    rank 1, whose next cell's collectives then paired with rank 0's old ones."""
    armed = [True]
    send = LocalRanks.send

    def send_then_interrupt(self: LocalRanks, rank: int, data: bytes) -> None:
        send(self, rank, data)
        if armed and rank == 0:
            armed.clear()
            os.kill(os.getpid(), signal.SIGINT)  # lands here, before rank 1 is sent the cell

    pool = WorkerPool(2, cpu=True, timeout=COLLECTIVE_TIMEOUT_S)
    pool.start()
    try:
        monkeypatch.setattr(LocalRanks, "send", send_then_interrupt)
        with pytest.raises(KeyboardInterrupt):
            pool.execute(SLEEPS)
        assert not armed  # the interrupt came as the cell was being sent
        with interrupted_unless_done("the next cell, on both ranks", 20):
            done = pool.execute(ALL_REDUCE, want_value=True)
        assert [load_value(done[rank]) for rank in (0, 1)] == [2.0, 2.0]
    finally:
        pool.stop()
