"""A launch closes what it opened before it returns, on every way out (success, a rank raising,
a rank killed, an interrupt), and leaves nothing of its own in reference cycles: with the
garbage collector off, launches leave the kernel's file descriptors and threads where they
were. The same for the ``%%distributed`` pool once it stops."""

from __future__ import annotations

import contextlib
import gc
import io
import multiprocessing.connection
import multiprocessing.process
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch.distributed as dist
from markers import wait_until

from nb_accel import WorkerDiedError, notebook_launcher
from nb_accel.launch import workers
from nb_accel.launch.pool import WorkerPool
from nb_accel.launch.processes import WorkerProcess, start_worker
from nb_accel.worker.process.spec import WorkerArgs

#: Launches of each kind measured: a launch that left one pipe open would leave this many.
REPEATS = 20


class RankOneFailed(Exception):
    """What rank 1 raises in a failing launch."""


def returns_rank() -> int:
    return dist.get_rank()


def rank_one_raises() -> None:
    if dist.get_rank() == 1:
        raise RankOneFailed("rank 1 gave up")
    dist.barrier()  # rank 0 waits here until the launch stops it


def rank_one_is_killed() -> None:
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()  # rank 0 waits here until the launch stops it


def waits_for_the_interrupt(folder: str) -> None:
    Path(folder, f"rank{dist.get_rank()}").touch()  # the test interrupts once both are here
    threading.Event().wait(120)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _kernel_state() -> tuple[int, int]:
    """The kernel's open file descriptors and running threads."""
    return _open_fds(), threading.active_count()


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    """The garbage collector off for the block (after a collection), as it is between two of
    its runs: what the block leaves open must have been closed without it."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _ours(thing: object) -> bool:
    """An object of nb_accel, or a worker's process handle or connection."""
    kinds = (
        multiprocessing.process.BaseProcess,
        multiprocessing.connection.Connection,
        subprocess.Popen,
    )
    return type(thing).__module__.startswith("nb_accel") or isinstance(thing, kinds)


@contextlib.contextmanager
def left_in_cycles() -> Iterator[list[str]]:
    """The types of what the block made that only the garbage collector could free (nb_accel's
    objects, process handles and connections), filled in when the block ends."""
    found: list[str] = []
    gc.collect()
    flags = gc.get_debug()
    gc.set_debug(gc.DEBUG_SAVEALL)  # the collector keeps what it frees, to be looked at
    try:
        yield found
        gc.collect()
        found.extend(
            f"{type(thing).__module__}.{type(thing).__qualname__}"
            for thing in gc.garbage
            if _ours(thing)
        )
    finally:
        gc.set_debug(flags)
        gc.garbage.clear()


def _launch(
    function: Callable[..., object], *args: object, start_method: str | None = None
) -> list[object]:
    with contextlib.redirect_stdout(io.StringIO()):  # a stream that is no terminal
        return notebook_launcher(
            function, args, num_processes=2, cpu=True, start_method=start_method
        )


def succeeds() -> None:
    assert _launch(returns_rank) == [0, 1]


def fails() -> None:
    with pytest.raises(RankOneFailed, match="rank 1 gave up"):
        _launch(rank_one_raises)


def is_killed() -> None:
    with pytest.raises(WorkerDiedError, match="SIGKILL"):
        _launch(rank_one_is_killed)


def _interrupt_once_both_wait(folder: Path, done: threading.Event) -> None:
    """SIGINT to this process once both ranks' markers are in ``folder`` (nothing when ``done``
    comes first: the launch ended otherwise, and says why)."""
    markers = (folder / "rank0", folder / "rank1")
    wait_until(lambda: done.is_set() or all(m.exists() for m in markers), "both ranks waiting")
    if not done.is_set():
        os.kill(os.getpid(), signal.SIGINT)


def interrupted(folder: Path) -> None:
    """A launch interrupted (SIGINT to this process) once both ranks wait in the function."""
    folder.mkdir()
    done = threading.Event()
    interrupter = threading.Thread(target=_interrupt_once_both_wait, args=(folder, done))
    interrupter.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            _launch(waits_for_the_interrupt, str(folder))
    finally:
        done.set()
        interrupter.join()


def _repeat_with_collector_off(launch: Callable[[int], None], repeats: int = REPEATS) -> None:
    """``launch`` once to warm up, then ``repeats`` times with the collector off: the kernel's
    descriptors and threads are where they were after each."""
    launch(-1)  # what the first launch loads and keeps (torch, the loopback's name) is no leak
    with collector_off():
        before = _kernel_state()
        for number in range(repeats):
            launch(number)
            assert _kernel_state() == before, f"(descriptors, threads) after launch {number}"


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "launch",
    [succeeds, fails, is_killed],
    ids=["success", "a rank raises", "a rank is killed"],
)
def test_launches_leave_descriptors_and_threads_as_they_were(launch: Callable[[], None]) -> None:
    _repeat_with_collector_off(lambda _: launch())


@pytest.mark.timeout(180)
def test_interrupted_launches_leave_descriptors_and_threads_as_they_were(tmp_path: Path) -> None:
    _repeat_with_collector_off(lambda number: interrupted(tmp_path / f"launch{number}"))


@pytest.mark.timeout(120)
def test_spawned_launches_leave_descriptors_and_threads_as_they_were() -> None:
    def launch(_: int) -> None:
        assert _launch(returns_rank, start_method="spawn") == [0, 1]

    _repeat_with_collector_off(launch, repeats=2)  # a spawned worker takes seconds to start


@pytest.fixture
def workers_kept(monkeypatch: pytest.MonkeyPatch) -> list[WorkerProcess]:
    """Every worker process the launches start, kept alive by the test after the launch."""
    kept: list[WorkerProcess] = []

    def start_and_keep(method: str, args: WorkerArgs) -> WorkerProcess:
        worker = start_worker(method, args)
        kept.append(worker)
        return worker

    monkeypatch.setattr(workers, "start_worker", start_and_keep)
    return kept


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "launch",
    [succeeds, fails, is_killed],
    ids=["success", "a rank raises", "a rank is killed"],
)
def test_a_launch_closes_its_workers_pipes_itself(
    launch: Callable[[], None], workers_kept: list[WorkerProcess]
) -> None:
    # With its workers' objects still held, nothing of theirs is freed: the launch must have
    # closed every pipe, connection and process handle itself.
    _repeat_with_collector_off(lambda _: launch(), repeats=3)
    assert len(workers_kept) == 2 * 4


@pytest.mark.parametrize(
    "launch",
    [succeeds, fails, is_killed],
    ids=["success", "a rank raises", "a rank is killed"],
)
def test_a_launch_leaves_nothing_in_reference_cycles(launch: Callable[[], None]) -> None:
    launch()  # warm-up: imports, caches
    with left_in_cycles() as found:
        launch()
    assert not found, f"left in reference cycles: {sorted(set(found))}"


def test_an_interrupted_launch_leaves_nothing_in_reference_cycles(tmp_path: Path) -> None:
    interrupted(tmp_path / "warm-up")
    with left_in_cycles() as found:
        interrupted(tmp_path / "measured")
    assert not found, f"left in reference cycles: {sorted(set(found))}"


def _use_pool(folder: Path) -> None:
    """Start a pool, run a command, a failing one and an interrupted one, and stop it."""
    pool = WorkerPool(2, cpu=True)
    pool.start()
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            pool.execute("value = rank")
            assert pool.pull("value") == [0, 1]
            with pytest.raises(ValueError, match="rank 1 gave up"):
                pool.execute("if rank == 1: raise ValueError('rank 1 gave up')")
            folder.mkdir()
            done = threading.Event()
            interrupter = threading.Thread(target=_interrupt_once_both_wait, args=(folder, done))
            interrupter.start()
            try:
                with pytest.raises(KeyboardInterrupt):
                    pool.execute(
                        "import pathlib, threading\n"
                        f"pathlib.Path({str(folder)!r}, f'rank{{rank}}').touch()\n"
                        "threading.Event().wait(120)"
                    )
            finally:
                done.set()
                interrupter.join()
    finally:
        pool.stop()


@pytest.mark.timeout(180)
def test_a_stopped_pool_leaves_descriptors_and_threads_as_they_were(
    tmp_path: Path, workers_kept: list[WorkerProcess]
) -> None:
    _use_pool(tmp_path / "warm-up")
    with collector_off():
        before = _kernel_state()
        for number in range(3):  # its workers' objects held: what they had, the pool closed
            _use_pool(tmp_path / f"pool{number}")
            assert _kernel_state() == before, f"(descriptors, threads) after pool {number}"


@pytest.mark.timeout(120)
def test_a_stopped_pool_leaves_nothing_in_reference_cycles(tmp_path: Path) -> None:
    _use_pool(tmp_path / "warm-up")
    with left_in_cycles() as found:
        _use_pool(tmp_path / "cycles")
    assert not found, f"left in reference cycles: {sorted(set(found))}"
