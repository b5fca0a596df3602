"""A launch interrupted at its very end, once its ranks have returned and the kernel gives them
their grace to exit, still stops and reaps every worker and removes its scratch folder: the
interrupt ends the grace, never the stopping (the chaos campaign's cold-spawn / interrupt at
teardown, on a loaded machine, left both spawned ranks zombies of the kernel and the launch's
folder in ``/dev/shm``)."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import tempfile
import threading
from pathlib import Path

import pytest
import torch.distributed as dist
from markers import interrupt_when_marked

from nb_accel import notebook_launcher
from nb_accel.worker.transfer.segments import SHM_ROOT

pytestmark = pytest.mark.timeout(120)


def returns_then_lingers(folder: str) -> int:
    """Return this rank, then linger on the way out (where the worker leaves its process
    group) until it is stopped: the kernel is then in the ranks' grace to exit."""
    import nb_accel.worker.process.entrypoint as entrypoint

    rank = dist.get_rank()

    def linger() -> None:
        Path(folder, f"pid-{os.getpid()}").touch()
        Path(folder, f"rank{rank}").touch()  # the test interrupts once both are here
        threading.Event().wait(100)

    entrypoint.leave_process_group = linger
    return rank


def _scratch_folders() -> set[str]:
    """This process's launch folders, wherever they are made."""
    prefix = f"nb_accel-launch-{os.getpid()}-"
    return {
        entry.name
        for root in {SHM_ROOT, tempfile.gettempdir()}
        if os.path.isdir(root)
        for entry in os.scandir(root)
        if entry.name.startswith(prefix)
    }


def _pids(folder: Path) -> list[int]:
    """The workers' pids, from their markers."""
    return [int(marker.name.split("-")[1]) for marker in folder.glob("pid-*")]


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_an_interrupt_in_the_ranks_grace_to_exit_still_reaps_them(
    tmp_path: Path, start_method: str
) -> None:
    before = _scratch_folders()
    try:
        with (
            pytest.raises(KeyboardInterrupt),
            interrupt_when_marked(tmp_path),
            contextlib.redirect_stdout(io.StringIO()),
        ):
            notebook_launcher(
                returns_then_lingers,
                (str(tmp_path),),
                num_processes=2,
                cpu=True,
                start_method=start_method,
            )
        pids = _pids(tmp_path)
        assert len(pids) == 2, sorted(tmp_path.iterdir())
        left = [pid for pid in pids if os.path.exists(f"/proc/{pid}")]
        assert not left, f"workers left (running or unreaped): {left}"
        assert _scratch_folders() == before
    finally:  # whatever a failed check left: nothing outlives the test
        for pid in _pids(tmp_path):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
