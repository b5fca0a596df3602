"""``max_restarts`` on one machine: torch's elastic agent restarts the whole group after a
failure, the workers see ``TORCHELASTIC_RESTART_COUNT``, each restart is shown with its cause,
a failure that repeats on every attempt is reported once, and a run written as Accelerate
documents resuming ends exactly where an uninterrupted run ends."""

from __future__ import annotations

import logging
import multiprocessing.process
import os
import signal
import threading
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist
from resumable_training import train

from nb_accel import notebook_launcher
from nb_accel.errors import WorkerDiedError
from nb_accel.launch.multinode.node_ranks import NodeRanks


def _attempt() -> int:
    return int(os.environ["TORCHELASTIC_RESTART_COUNT"])


def killed_on_the_first_attempt() -> tuple[int, int]:
    """Rank 1 is killed (SIGKILL) in the first attempt, after a collective; the next attempt
    runs through."""
    dist.barrier()
    if dist.get_rank() == 1 and _attempt() == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()
    return dist.get_rank(), _attempt()


@pytest.mark.timeout(120)
def test_a_killed_rank_restarts_the_whole_group(capfd: pytest.CaptureFixture[str]) -> None:
    results = notebook_launcher(killed_on_the_first_attempt, num_processes=2, max_restarts=2)
    assert results == [(0, 1), (1, 1)]  # both ranks of the second attempt
    out, err = capfd.readouterr()
    assert "up to 2 restarts after a failure" in out
    assert "rank 1 failed: worker for rank 1" in err
    assert "restart 1 of 2 after rank 1 was killed by SIGKILL" in err
    assert "restart 2" not in err
    assert psutil.Process().children(recursive=True) == []


class _Records(logging.Handler):
    """Keeps every record that reaches it."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def killed_on_every_attempt() -> None:
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()


def process_group() -> tuple[int, int]:
    return os.getpid(), os.getpgrp()


@pytest.mark.timeout(120)
def test_a_nodes_workers_hear_the_kernels_interrupt_only_through_its_agent() -> None:
    """Jupyter sends its interrupt to the kernel's whole process group: a worker of torch's
    agent in the kernel (``max_restarts``, a node of ``num_nodes``) leads a group of its own,
    as every worker does. In the kernel's group it heard the interrupt at once, as the agent
    woke it to exit, and unlocked the agent's lock of that wake-up a second time: the agent
    failed with ``ValueError: semaphore or lock released too many times`` instead of the
    interrupt, leaving the launch's store and the other node running (a chaos scenario,
    nodes / interrupt at teardown, under load)."""
    groups = notebook_launcher(process_group, num_processes=2, max_restarts=1)
    assert [group for _, group in groups] == [pid for pid, _ in groups]  # each its own
    assert os.getpgrp() not in [group for _, group in groups]


@pytest.mark.timeout(120)
def test_an_interrupt_as_the_launch_starts_listening_leaves_no_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kernel's interrupt lands once the launch listens for its workers (two threads of
    the kernel) and before the ranks that stop them hold them (chaos seed 11483, restarts /
    interrupt at start-up): the launch is interrupted, and the threads end with it. They used
    to run on in the kernel, listening for workers that never came."""
    made = NodeRanks.__init__

    def interrupted_as_made(self: NodeRanks, *args: object, **kwargs: object) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # lands here: the events listen already
        made(self, *args, **kwargs)

    before = set(threading.enumerate())
    monkeypatch.setattr(NodeRanks, "__init__", interrupted_as_made)
    with pytest.raises(KeyboardInterrupt):
        notebook_launcher(process_group, num_processes=2, max_restarts=1)
    left = [t.name for t in threading.enumerate() if t not in before and t.is_alive()]
    assert left == [], left
    assert psutil.Process().children(recursive=True) == []


@pytest.mark.timeout(120)
def test_an_interrupt_between_two_workers_starts_leaves_no_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kernel's interrupt lands after torch's agent started rank 0 and before rank 1
    (chaos seed 11441, nodes / interrupt at start-up): the launch is interrupted, and rank 0
    is stopped and reaped. torch's agent keeps its workers only once all have started: rank 0
    was left, to end as a zombie of the kernel that nothing reaped."""
    armed = [True]
    start = multiprocessing.process.BaseProcess.start

    def start_then_interrupt(self: multiprocessing.process.BaseProcess) -> None:
        start(self)
        if armed:
            armed.clear()
            os.kill(os.getpid(), signal.SIGINT)  # torch's handler raises it here

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", start_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        notebook_launcher(process_group, num_processes=2, max_restarts=1)
    assert not armed  # the interrupt came between the two starts
    assert psutil.Process().children(recursive=True) == []


@pytest.mark.timeout(120)
def test_torchs_elastic_agent_logs_nothing_of_its_own() -> None:
    """The launch says what happened, once; torch's agent (which would log each stop and each
    worker's traceback, and import ``torch._dynamo`` for a second to format them) is quiet
    while it runs, on every node, and its loggers' levels are given back after."""
    records = _Records()
    torch_logger = logging.getLogger("torch")
    spawn_logger = logging.getLogger("torch.multiprocessing.spawn")
    level = spawn_logger.level
    spawn_logger.setLevel(logging.INFO)
    torch_logger.addHandler(records)
    try:
        with pytest.raises(WorkerDiedError, match=r"rank 1 .* was killed by SIGKILL"):
            notebook_launcher(killed_on_every_attempt, num_processes=2, max_restarts=1)
        assert spawn_logger.level == logging.INFO
    finally:
        torch_logger.removeHandler(records)
        spawn_logger.setLevel(level)
    assert [f"{r.name}: {r.getMessage()}" for r in records.records] == []


def rank_zero_always_fails() -> None:
    if dist.get_rank() == 0:
        raise ValueError(f"bad config (attempt {_attempt() - _attempt()})")  # the same text
    dist.barrier()


@pytest.mark.timeout(120)
def test_an_error_on_every_attempt_is_reported_once(capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match=r"bad config \(attempt 0\)") as info:
        notebook_launcher(rank_zero_always_fails, num_processes=2, max_restarts=2)
    notes = "\n".join(info.value.__notes__)
    assert "This error ended every one of the 3 attempts (the first run and 2 restarts" in notes
    assert notes.count("bad config") == 0  # the error itself is the exception, once
    err = capfd.readouterr().err
    assert "restart 1 of 2 after rank 0 raised ValueError: bad config (attempt 0)" in err
    assert "restart 2 of 2 after the same failure again (rank 0, ValueError)" in err
    assert psutil.Process().children(recursive=True) == []


def killed_then_failing() -> None:
    dist.barrier()
    if dist.get_rank() == 1 and _attempt() == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    if dist.get_rank() == 0 and _attempt() == 1:
        raise KeyError("label")
    dist.barrier()


@pytest.mark.timeout(120)
def test_the_error_says_what_ended_the_attempts_before_it() -> None:
    with pytest.raises(KeyError) as info:
        notebook_launcher(killed_then_failing, num_processes=2, max_restarts=1)
    notes = "\n".join(info.value.__notes__)
    assert (
        "The worker group was restarted 1 time (max_restarts=1) before this failure: attempt 1 "
        "ended when rank 1 was killed by SIGKILL." in notes
    )


def killed_every_time() -> None:
    dist.barrier()
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()


@pytest.mark.timeout(120)
def test_a_kill_on_the_last_attempt_is_not_blamed_on_memory() -> None:
    with pytest.raises(WorkerDiedError) as info:
        notebook_launcher(killed_every_time, num_processes=2, max_restarts=1)
    assert "rank 1" in str(info.value) and "was killed by SIGKILL (not by the out-of-memory" in (
        str(info.value)
    )


def test_warm_workers_and_restarts_are_refused_together() -> None:
    with pytest.raises(ValueError, match="max_restarts=1 restarts a launch's workers"):
        notebook_launcher(print, num_processes=2, max_restarts=1, reuse_workers=True)


@pytest.mark.timeout(180)
def test_a_run_killed_mid_epoch_resumes_to_the_same_weights(tmp_path: Path) -> None:
    """Checkpoints every 5 steps, rank 1 killed after step 23 (of 32, in the third epoch):
    the restarted run loads checkpoint 20, skips the epoch's first 4 batches, and ends with
    the uninterrupted run's weights, bit for bit, on every rank."""
    whole = notebook_launcher(train, args=(str(tmp_path / "whole"),), num_processes=2)
    resumed = notebook_launcher(
        train,
        args=(str(tmp_path / "resumed"),),
        kwargs={"kill_at": 23},
        num_processes=2,
        max_restarts=1,
    )
    for (steps, weights), (steps_resumed, weights_resumed) in zip(whole, resumed, strict=True):
        assert steps == steps_resumed == 32
        assert weights.keys() == weights_resumed.keys()
        for name, value in weights.items():
            assert torch.equal(value, weights_resumed[name]), name
    # the first attempt wrote checkpoints 0-3 (steps 5-20), the second 4-5 (steps 25, 30)
    names = sorted(path.name for path in (tmp_path / "resumed" / "checkpoints").iterdir())
    assert names == [f"checkpoint_{number}" for number in range(6)]


def stops_at_a_breakpoint_on_rank_one() -> int:
    if dist.get_rank() == 1:
        breakpoint()
    dist.barrier()
    return dist.get_rank()


@pytest.mark.timeout(120)
def test_a_breakpoint_asks_in_the_kernel(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The agent's workers ask the kernel too (as every launch's do), on a thread of its own
    while the agent holds the main thread."""
    answers = iter(["p dist.get_rank() * 7", "c"])
    asked: list[str] = []
    monkeypatch.setattr("builtins.input", lambda prompt="": asked.append(prompt) or next(answers))
    results = notebook_launcher(stops_at_a_breakpoint_on_rank_one, num_processes=2, max_restarts=1)
    assert results == [0, 1]
    assert asked == ["(Pdb rank 1) ", "(Pdb rank 1) "]
    assert "[rank 1] 7" in capfd.readouterr().out
