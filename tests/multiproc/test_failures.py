"""A worker's failure reaches the caller as the user would want it, and nothing is left behind."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist
from markers import interrupt_when_marked

from nb_accel import (
    CollectiveTimeoutError,
    WorkerDiedError,
    WorkerError,
    notebook_launcher,
)
from nb_accel.errors import RemoteTraceback


class TrainingDiverged(Exception):
    """A user-defined exception type."""


def fail_on_rank_one() -> str:
    if dist.get_rank() == 1:
        raise TrainingDiverged("loss is nan at step 3")
    time.sleep(60)
    return "unreachable"


def test_exception_keeps_its_type_traceback_and_rank() -> None:
    with pytest.raises(TrainingDiverged, match="loss is nan at step 3") as info:
        notebook_launcher(fail_on_rank_one, num_processes=2)
    assert psutil.Process().children(recursive=True) == []  # rank 0 was stopped, not awaited
    error = info.value
    assert isinstance(error.__cause__, RemoteTraceback)
    assert "Traceback from rank 1" in str(error.__cause__)
    assert 'raise TrainingDiverged("loss is nan at step 3")' in str(error.__cause__)
    assert any("rank 1 of 2" in note for note in error.__notes__)


@pytest.mark.parametrize("method", ["spawn"])
def test_exception_type_survives_spawn(method: str) -> None:
    with pytest.raises(TrainingDiverged):
        notebook_launcher(fail_on_rank_one, num_processes=2, start_method=method)


def test_identical_failures_are_reported_once_with_all_ranks() -> None:
    def everyone_fails() -> None:
        raise KeyError("missing column 'label'")

    with pytest.raises(KeyError) as info:
        notebook_launcher(everyone_fails, num_processes=3)
    notes = "\n".join(info.value.__notes__)
    assert "ranks 0-2 of 3 (identical on each)" in notes
    assert "Other failures" not in notes


def test_different_failures_are_all_listed() -> None:
    def rank_specific() -> None:
        raise ValueError(f"bad shard {dist.get_rank()}")

    with pytest.raises(ValueError) as info:
        notebook_launcher(rank_specific, num_processes=2)
    failures = info.value.nb_accel_failures  # type: ignore[attr-defined]
    assert sorted(f.rank for f in failures) == [0, 1]
    assert "Other failures" in "\n".join(info.value.__notes__)


def test_unpicklable_exception_becomes_worker_error() -> None:
    class HoldsALock(Exception):
        def __init__(self) -> None:
            super().__init__("cannot travel")
            self.lock = threading.Lock()

    def raise_it() -> None:
        raise HoldsALock()

    with pytest.raises(WorkerError) as info:
        notebook_launcher(raise_it, num_processes=2)
    assert "HoldsALock: cannot travel" in str(info.value)
    assert info.value.ranks == [0, 1]
    assert "raise HoldsALock()" in info.value[1].traceback


def test_unpicklable_return_value_is_explained() -> None:
    with pytest.raises(TypeError, match="rank 0 returned a lock that cannot be sent back"):
        notebook_launcher(threading.Lock, num_processes=1)


def killed_by_signal() -> None:
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()


def test_worker_killed_by_signal_is_named() -> None:
    with pytest.raises(WorkerDiedError) as info:
        notebook_launcher(killed_by_signal, num_processes=2)
    assert psutil.Process().children(recursive=True) == []
    message = str(info.value)
    assert "rank 1" in message and "SIGKILL" in message
    assert info.value[1].signal_name == "SIGKILL"


def test_worker_exiting_without_result_is_reported() -> None:
    def exits() -> None:
        os._exit(3)

    with pytest.raises(WorkerDiedError, match="exited with code 3 without reporting"):
        notebook_launcher(exits, num_processes=1)


def skips_the_barrier() -> None:
    if dist.get_rank() == 0:
        dist.barrier()
    else:
        time.sleep(60)


def test_collective_timeout_names_the_missing_rank() -> None:
    with pytest.raises(CollectiveTimeoutError) as info:
        notebook_launcher(skips_the_barrier, num_processes=2, timeout=2)
    message = str(info.value)
    assert "timed out after 2 s on rank 0 of 2" in message
    assert "Rank 1 did not arrive (was still running, at `skips_the_barrier` (" in message


def waits_for_each_other() -> None:
    peer = 1 - dist.get_rank()
    dist.recv(torch.ones(1), src=peer)  # each waits for the other: neither ever sends


@pytest.mark.timeout(60)
def test_a_receive_nobody_answers_times_out_too() -> None:
    """A point-to-point receive (which gloo keeps out of torch's flight recorder) is held to
    the launch's timeout as a collective is."""
    with pytest.raises(CollectiveTimeoutError) as info:
        notebook_launcher(waits_for_each_other, num_processes=2, timeout=2)
    assert "timed out after 2 s on ranks 0, 1 of 2 (in recv (point-to-point))" in str(info.value)


def test_rank_that_returned_early_is_named_when_a_collective_breaks() -> None:
    def returns_early() -> None:
        if dist.get_rank() == 0:
            dist.barrier()

    with pytest.raises(RuntimeError) as info:
        notebook_launcher(returns_early, num_processes=2, timeout=30)
    assert "rank 1 had already returned" in "\n".join(info.value.__notes__)


def sleep_once_marked(folder: str) -> None:
    """Write this rank's marker, then sleep (until the launch is interrupted)."""
    Path(folder, f"rank{dist.get_rank()}").touch()
    time.sleep(60)


def test_keyboard_interrupt_stops_every_worker_and_next_launch_works(tmp_path: Path) -> None:
    with interrupt_when_marked(tmp_path), pytest.raises(KeyboardInterrupt):
        notebook_launcher(sleep_once_marked, args=(str(tmp_path),), num_processes=2)
    assert psutil.Process().children(recursive=True) == []
    assert notebook_launcher(lambda: "again", num_processes=2) == ["again", "again"]
