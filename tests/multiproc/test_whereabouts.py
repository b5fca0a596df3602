"""Where a rank is: a collective timeout names the function the missing rank was in (its
stack, taken without stopping it) and the collective each rank last entered (torch's flight
recorder), under fork and spawn; an interrupted launch says where every rank was, and stops
ranks that wait inside a collective at once (their collective timeout is far above the test's
own: it never ends their wait)."""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist
from markers import interrupt_when_marked, touch_when_waiting

from nb_accel import notebook_launcher
from nb_accel.errors import CollectiveTimeoutError

#: The test's own bound (seconds), and a collective timeout far above it.
TEST_TIMEOUT_S = 120
COLLECTIVE_TIMEOUT_S = 10 * TEST_TIMEOUT_S

pytestmark = pytest.mark.timeout(TEST_TIMEOUT_S)


def stuck_here_forever(release: threading.Event) -> None:
    while not release.is_set():
        release.wait(0.05)


def train() -> None:
    dist.broadcast(torch.ones(1), 0)
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
    # rank 0 waits in the all-reduce that follows the broadcast rank 1 last entered
    waiting = re.search(r"on rank 0 of 2 \(in all_reduce #(\d+)\)", message)
    behind = re.search(r"; last collective: broadcast #(\d+)\)", message)
    assert waiting and behind, message
    assert int(waiting.group(1)) == int(behind.group(1)) + 1
    notes = "\n".join(getattr(info.value, "__notes__", []))  # its every thread, innermost last
    stacks = notes[notes.index("Rank 1's stacks:") :]
    assert "main thread:" in stacks
    assert stacks.index(", in train") < stacks.index(", in stuck_here_forever"), stacks


def waiting_here(marker: str) -> None:
    Path(marker).touch()  # the test interrupts the kernel once every rank is here
    threading.Event().wait(120)


def both_wait(folder: str) -> None:
    waiting_here(os.path.join(folder, f"rank{dist.get_rank()}"))


def test_an_interrupted_launch_says_where_each_rank_was(tmp_path: Path) -> None:
    with interrupt_when_marked(tmp_path), pytest.raises(KeyboardInterrupt) as info:
        notebook_launcher(both_wait, args=(str(tmp_path),), num_processes=2)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    for rank in (0, 1):
        assert f"rank {rank} was at `waiting_here` (test_whereabouts.py, line " in notes, notes
    assert "← `both_wait` (line " in notes
    for rank in (0, 1):
        stacks = notes[notes.index(f"Rank {rank}'s stacks:") :]
        assert ", in waiting_here" in stacks.split("'s stacks:")[1], notes


def both_wait_inside_torch(folder: str) -> None:
    """Rank 0 waits in an all-reduce rank 1 never joins, rank 1 for a tensor rank 0 never
    sends: both inside torch's C++ code (where no signal handler runs), each marker written once
    its rank waits there."""
    rank = dist.get_rank()
    if rank == 0:
        work = dist.all_reduce(torch.ones(1), async_op=True)
    else:
        work = dist.irecv(torch.zeros(1), src=0)
    touch_when_waiting(os.path.join(folder, f"rank{rank}"), in_python=False)
    work.wait()


def test_an_interrupt_stops_ranks_waiting_in_a_collective_and_says_where(tmp_path: Path) -> None:
    with interrupt_when_marked(tmp_path), pytest.raises(KeyboardInterrupt) as info:
        notebook_launcher(
            both_wait_inside_torch,
            args=(str(tmp_path),),
            num_processes=2,
            timeout=COLLECTIVE_TIMEOUT_S,
        )
    assert psutil.Process().children(recursive=True) == []  # stopped, not waited for
    notes = "\n".join(getattr(info.value, "__notes__", []))
    for rank in (0, 1):
        assert f"rank {rank} was at `both_wait_inside_torch` (test_whereabouts.py, line " in notes
    assert re.search(r"rank 0 was at .*; last collective: all_reduce #\d+", notes), notes


def test_asking_where_the_ranks_are_again_and_again_leaves_them_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each rank is asked its last collective only once its stacks are written: the thread
    that answers must not run while faulthandler reads the frames (without the interpreter's
    lock), which cut the dump short and could crash the rank. Asked 60 times over, every
    answer has the main thread, and the ranks live on."""
    from nb_accel.launch import failures
    from nb_accel.launch.pool import WorkerPool
    from nb_accel.worker.reporting.stacks import stack_file

    whereabouts = failures.whereabouts
    asked_with_dump_written: list[bool] = []
    sizes_before: dict[int, int] = {}
    ask = whereabouts._ask_collective

    def ask_after_the_dump(folder: str, rank: int) -> bool:
        asked_with_dump_written.append(
            os.path.getsize(stack_file(folder, rank)) > sizes_before[rank]
        )
        return ask(folder, rank)

    monkeypatch.setattr(whereabouts, "_ask_collective", ask_after_the_dump)
    pool = WorkerPool(2, cpu=True)
    try:
        pool.start(notes=False)
        folder = pool._group._store  # type: ignore[union-attr]
        for _ in range(60):
            sizes_before.update({r: os.path.getsize(stack_file(folder, r)) for r in (0, 1)})
            stacks = pool.where()
            assert sorted(stacks) == [0, 1]
            assert all(s.main is not None and s.main.frames for s in stacks.values()), stacks
        assert asked_with_dump_written and all(asked_with_dump_written)
        assert [s.alive for s in pool.status()] == [True, True]
    finally:
        pool.stop()
