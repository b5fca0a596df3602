"""What an XLA worker process writes below Python's ``sys.stdout``/``sys.stderr`` — the XLA
runtime's C++ code, ``os.write``, programs it starts, ``faulthandler`` — reaches the caller, also
when the worker aborts right after writing it; a process of two rank threads shows it as its
first rank's. The last part drives the kernel's side with plain forked processes, to check a
launch of several worker processes (a TPU host) without one."""

from __future__ import annotations

import ctypes
import faulthandler
import multiprocessing
import multiprocessing.util
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from markers import wait_for_files

pytest.importorskip("torch_xla")

from nb_accel import Accelerator, WorkerDiedError, notebook_launcher
from nb_accel._messages import Output
from nb_accel.launch.views.view import NullView, register_view_factory, view_factory
from nb_accel.launch.xla.output import ProcessOutputs
from nb_accel.worker.process.process_fds import set_process_pipes, write_to_process_pipes

#: What the XLA runtime writes before it aborts its process on a failed check.
CHECK_FAILED = "F0000 00:00:1700000000.000000  4242 tpu_client.cc:99] Check failed: chips_ok\n"
#: Inherited by the forked worker: both rank threads of its process wait here.
BOTH_RANKS = threading.Barrier(2)


def _open_fds() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/fd")}


def write_below_python() -> None:
    rank = Accelerator().process_index
    os.write(2, f"os.write to fd 2 on rank {rank}\n".encode())
    libc = ctypes.CDLL(None)
    libc.printf(b"printf on rank %d\n", ctypes.c_int(rank))
    libc.fflush(None)
    subprocess.run([sys.executable, "-c", f"print('a program rank {rank} started')"], check=True)
    faulthandler.dump_traceback(sys.stderr, all_threads=False)  # to fd 2, as on a crash


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_processes", [None, 1])
def test_writes_to_the_file_descriptors_reach_the_caller(
    num_processes: int | None, capsys: pytest.CaptureFixture[str]
) -> None:
    fds_before = _open_fds()
    notebook_launcher(write_below_python, num_processes=num_processes, show_progress=False)
    captured = capsys.readouterr()
    assert "os.write to fd 2 on rank 0\n" in captured.err
    assert "printf on rank 0\n" in captured.out
    assert "a program rank 0 started\n" in captured.out
    assert "Stack (most recent call first):" in captured.err  # faulthandler
    assert "in write_below_python" in captured.err
    assert _open_fds() == fds_before  # the launch's pipes are closed


def write_from_both_rank_threads() -> int:
    rank = Accelerator().process_index
    BOTH_RANKS.wait(timeout=60)  # both threads are past the redirection
    os.write(1, f"os.write from the thread of rank {rank}\n".encode())
    return rank


@pytest.fixture
def two_rank_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """One worker process running two ranks, one thread each (as on a TPU v2/v3 chip)."""
    monkeypatch.setenv("CPU_NUM_DEVICES", "2")
    BOTH_RANKS.reset()
    yield


@pytest.mark.usefixtures("two_rank_threads")
def test_a_process_of_two_rank_threads_shows_its_writes_as_its_first_rank(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert notebook_launcher(write_from_both_rank_threads, show_progress=False) == [0, 1]
    out = capsys.readouterr().out
    assert "[rank 0] os.write from the thread of rank 0\n" in out
    assert "[rank 0] os.write from the thread of rank 1\n" in out


def abort_after_last_words(words: str, aborting_rank: int) -> None:
    if Accelerator().process_index == aborting_rank:
        os.write(2, words.encode())
        os.abort()
    time.sleep(60)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_processes", [None, 1])
def test_what_a_worker_wrote_just_before_it_aborted_is_shown_with_the_signal(
    num_processes: int | None, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(
        WorkerDiedError, match=r"worker for rank 0 \(pid \d+\) was killed by SIGABRT"
    ):
        notebook_launcher(
            abort_after_last_words,
            args=(CHECK_FAILED, 0),
            num_processes=num_processes,
            show_progress=False,
        )
    err = capsys.readouterr().err
    assert CHECK_FAILED in err
    if faulthandler.is_enabled():  # pytest turns it on, as a kernel may: the worker's report
        assert "Fatal Python error: Aborted" in err
        assert "in abort_after_last_words" in err


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("two_rank_threads")
def test_an_abort_in_a_process_of_two_rank_threads_names_both_ranks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(WorkerDiedError, match=r"worker process of ranks 0, 1 .* killed by SIGABRT"):
        notebook_launcher(abort_after_last_words, args=(CHECK_FAILED, 1), show_progress=False)
    assert "[rank 0] " + CHECK_FAILED in capsys.readouterr().err


def leave_words_for_later(folder: str) -> str:
    """Return; the worker process writes to fd 1 on its way out, once the kernel has its
    result (as a library's clean-up at exit does)."""

    def last_words() -> None:
        wait_for_files(Path(folder, "kernel-has-rank0-result"))
        os.write(1, b"late words\n")

    multiprocessing.util.Finalize(None, last_words, exitpriority=0)
    return "done"


class MarksResults(NullView):
    """A launch view that marks each rank's result as the kernel receives it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def returned(self, rank: int) -> None:
        """Mark it."""
        (self.folder / f"kernel-has-rank{rank}-result").touch()


@pytest.mark.timeout(120)
def test_what_a_worker_writes_after_its_result_is_still_shown(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    previous = view_factory()
    register_view_factory(lambda *args, **kwargs: MarksResults(tmp_path))
    try:
        assert notebook_launcher(leave_words_for_later, args=(str(tmp_path),)) == ["done"]
    finally:
        register_view_factory(previous)
    assert "late words\n" in capsys.readouterr().out


# The kernel's side, for a launch of two worker processes of two ranks each (a TPU v2-4 host),
# with processes forked here standing in for those xmp.spawn forks.


def _worker_process(index: int, abort: bool, every_end: list[int]) -> None:
    assert write_to_process_pipes(index)
    assert not write_to_process_pipes(index)  # once per process
    os.write(1, f"process {index} writes to fd 1\n".encode())
    if abort:
        os.write(2, CHECK_FAILED.encode())
        os.abort()
    leftover = [fd for fd in every_end if _is_open(fd)]
    os.write(2, f"still open: {sorted(leftover)}\n".encode())
    time.sleep(60)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _events(events: list[Output]) -> dict[tuple[int, str], str]:
    joined: dict[tuple[int, str], str] = {}
    for event in events:
        joined[(event.rank, event.stream)] = joined.get((event.rank, event.stream), "") + event.text
    return joined


@pytest.mark.timeout(60)
def test_each_worker_process_writes_to_its_own_pipes_and_its_abort_is_explained() -> None:
    outputs = ProcessOutputs(processes=2, ranks_per_process=2, world_size=4)
    fork = multiprocessing.get_context("fork")
    pipes = outputs.pipes()
    set_process_pipes(pipes)
    try:
        first = fork.Process(target=_worker_process, args=(0, False, pipes.every_end()))
        second = fork.Process(target=_worker_process, args=(1, True, pipes.every_end()))
        first.start()
        second.start()
    finally:
        set_process_pipes(None)
    try:
        for rank, process in ((0, first), (1, first), (2, second), (3, second)):
            assert process.pid is not None
            outputs.started(rank, process.pid)
        second.join(30)
        seen: list[Output] = []
        while first.is_alive() and "still open" not in _events(seen).get((0, "stderr"), ""):
            seen += [event for fd in outputs.fds for event in outputs.read(fd)]
            time.sleep(0.01)
        first.terminate()  # as xmp.spawn ends the other processes once one has died
        first.join(30)
        seen += outputs.finish()
    finally:
        outputs.close()
    text = _events(seen)
    assert text[(0, "stdout")] == "process 0 writes to fd 1\n"
    assert text[(2, "stdout")] == "process 1 writes to fd 1\n"
    assert CHECK_FAILED in text[(2, "stderr")]
    assert text[(0, "stderr")] == "still open: []\n"  # the other process's pipes, the read ends
    deaths = outputs.deaths(returned=(), failed=())
    assert [(d.rank, d.signal_name) for d in deaths] == [(2, "SIGABRT")]  # not the SIGTERM
    assert deaths[0].message.startswith(f"worker process of ranks 2, 3 (pid {second.pid}) was")


def _die_before_starting(go: Any) -> None:
    go.wait(30)
    faulthandler.disable()  # its report would go to this process's own stderr
    os.abort()


@pytest.mark.timeout(60)
def test_a_process_that_died_before_its_ranks_started_is_named_with_its_signal() -> None:
    outputs = ProcessOutputs(processes=1, ranks_per_process=1, world_size=1)
    fork = multiprocessing.get_context("fork")
    go = fork.Event()
    try:
        process = fork.Process(target=_die_before_starting, args=(go,))
        process.start()
        outputs.track()  # as the launch does while it waits
        go.set()
        process.join(30)
        outputs.finish()
    finally:
        outputs.close()
    assert outputs.deaths(returned=(), failed=()) == []
    assert outputs.unstarted().startswith(f"pid {process.pid} was killed by SIGABRT")
