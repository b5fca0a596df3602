"""What a worker writes below Python's ``sys.stdout``/``sys.stderr`` — C libraries, ``os.write``,
programs it starts, ``faulthandler`` — reaches the caller with the rank's prefix, also when the
worker aborts right after writing it; NCCL's watchdog abort is a collective timeout."""

from __future__ import annotations

import ctypes
import faulthandler
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.distributed as dist
from markers import wait_for_files

from nb_accel import CollectiveTimeoutError, WorkerDiedError, notebook_launcher
from nb_accel.launch.views.view import NullView, register_view_factory, view_factory

#: What NCCL's watchdog writes (torch 2.x) before it aborts the process, here from rank 1.
WATCHDOG_TEXT = (
    "[rank1]:[E1124 07:10:06.885638456 ProcessGroupNCCL.cpp:2197] [PG ID 0 PG GUID "
    "0(default_pg) Rank 1] Process group watchdog thread terminated with exception: [Rank 1] "
    "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, "
    "NumelIn=4, NumelOut=4, Timeout(ms)=5000) ran for 5004 milliseconds before timing out.\n"
)


def write_below_python() -> None:
    rank = dist.get_rank()
    os.write(2, f"os.write to fd 2 on rank {rank}\n".encode())
    libc = ctypes.CDLL(None)
    libc.printf(b"printf on rank %d\n", ctypes.c_int(rank))
    libc.fflush(None)
    subprocess.run([sys.executable, "-c", f"print('a program rank {rank} started')"], check=True)
    faulthandler.dump_traceback(sys.stderr, all_threads=False)  # to fd 2, as on a crash


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_writes_to_the_file_descriptors_reach_the_caller_with_the_rank(
    method: str, capsys: pytest.CaptureFixture[str]
) -> None:
    notebook_launcher(write_below_python, num_processes=2, start_method=method)
    captured = capsys.readouterr()
    for rank in (0, 1):
        assert f"[rank {rank}] os.write to fd 2 on rank {rank}\n" in captured.err
        assert f"[rank {rank}] printf on rank {rank}\n" in captured.out
        assert f"[rank {rank}] a program rank {rank} started\n" in captured.out
        assert f"[rank {rank}] Stack (most recent call first):" in captured.err  # faulthandler
        assert f"[rank {rank}]   File " in captured.err


def abort_after_last_words(words: str) -> None:
    if dist.get_rank() == 1:
        os.write(2, words.encode())
        os.abort()
    time.sleep(60)


def test_what_a_worker_wrote_just_before_it_aborted_is_shown_with_the_signal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(WorkerDiedError, match=r"rank 1 .* killed by SIGABRT"):
        notebook_launcher(abort_after_last_words, args=("my last words\n",), num_processes=2)
    assert "[rank 1] my last words\n" in capsys.readouterr().err


@pytest.mark.skipif(not faulthandler.is_enabled(), reason="pytest's faulthandler plugin is off")
def test_an_inherited_faulthandler_reports_a_crash_to_the_caller(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # This process has faulthandler on (pytest turns it on), as a kernel may: a forked worker
    # inherits it, writing where this process told it to, and reports its crash here instead.
    with pytest.raises(WorkerDiedError, match=r"rank 1 .* killed by SIGABRT"):
        notebook_launcher(abort_after_last_words, args=("crashing\n",), num_processes=2)
    err = capsys.readouterr().err
    assert "[rank 1] Fatal Python error: Aborted" in err
    assert "in abort_after_last_words" in err


def test_an_nccl_watchdog_abort_is_a_collective_timeout_on_its_rank(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(CollectiveTimeoutError) as info:
        notebook_launcher(abort_after_last_words, args=(WATCHDOG_TEXT,), num_processes=2)
    error = info.value
    assert error.ranks == [1]
    assert error[1].signal_name == "SIGABRT"
    message = str(error)
    assert "timed out after 1800 s on rank 1 of 2" in message
    assert "Rank 0 did not arrive" in message
    assert "NCCL's watchdog stopped rank 1" in message
    assert "WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=4" in message
    assert "[rank 1] [rank1]:[E1124" in capsys.readouterr().err  # NCCL's own lines are shown


def leave_words_for_later(folder: str) -> str:
    """Return; rank 0 then writes to its fd 1 while its process group is torn down, once the
    kernel has its result (as a library's clean-up at exit does)."""
    if dist.get_rank() == 0:
        destroy = dist.destroy_process_group

        def destroy_with_last_words(*args: object, **kwargs: object) -> None:
            wait_for_files(Path(folder, "kernel-has-rank0-result"))
            os.write(1, b"late words\n")
            destroy(*args, **kwargs)  # type: ignore[arg-type]

        dist.destroy_process_group = destroy_with_last_words
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
        results = notebook_launcher(leave_words_for_later, args=(str(tmp_path),), num_processes=2)
    finally:
        register_view_factory(previous)
    assert results == ["done", "done"]
    assert "[rank 0] late words\n" in capsys.readouterr().out
