"""Where ranks are, through a real kernel: `%distributed where` shows every rank's stacks, each
thread's, taken without stopping the ranks, and the collective each last entered; a collective
timeout names the cell a missing rank is in."""

from __future__ import annotations

from jupyter_client.blocking import BlockingKernelClient
from kernel_driver import CellRun, collect, run_cell, running_kernel

#: Rank 1 leaves a thread waiting in a function of the cell, after an all-reduce.
BACKGROUND = """%%distributed -n 2
import threading
import torch
import torch.distributed as dist
dist.all_reduce(torch.ones(1))
release = threading.Event()
def waiting_in_background():
    release.wait(120)
if rank == 1:
    threading.Thread(target=waiting_in_background, daemon=True).start()
"""


def _ok(client: BlockingKernelClient, code: str) -> CellRun:
    run = run_cell(client, code)
    assert run.status == "ok", (run.ename, run.evalue, "\n".join(run.traceback))
    return run


def test_where_shows_every_rank_and_every_thread() -> None:
    with running_kernel() as (_, client):
        _ok(client, "%load_ext nb_accel")
        _ok(client, BACKGROUND)
        where = _ok(client, "%distributed where").stdout
        assert "rank 0: idle (waiting for a cell); last collective: all_reduce #" in where
        assert "rank 1: idle (waiting for a cell); last collective: all_reduce #" in where
        rank1 = where[where.index("rank 1:") :]
        assert (
            "in waiting_in_background" in rank1
            and "in waiting_in_background" not in (where[: where.index("rank 1:")])
        )
        only = _ok(client, "%distributed where --ranks 1").stdout
        assert "rank 0" not in only and "rank 1:" in only
        _ok(client, "%%distributed\nrelease.set()")


#: A launch whose rank 1 never reaches the collective rank 0 waits in.
STUCK = """import threading
import torch
import torch.distributed as dist
from nb_accel import notebook_launcher

def stuck_here_forever():
    threading.Event().wait(120)

def train():
    if dist.get_rank() == 1:
        stuck_here_forever()
    dist.all_reduce(torch.ones(1))
"""


def test_a_timeout_names_the_cell_the_missing_rank_is_in() -> None:
    with running_kernel() as (_, client):
        _ok(client, STUCK)
        failed = run_cell(client, "notebook_launcher(train, num_processes=2, timeout=3)")
        assert failed.ename == "CollectiveTimeoutError", failed.evalue
        assert "at `stuck_here_forever` (Cell In[1], line 7) ← `train` (line 11)" in (failed.evalue)


def _numbered(client: BlockingKernelClient, code: str) -> CellRun:
    """Run ``code`` as a notebook does: numbered, in the history."""
    return collect(client, client.execute(code, store_history=True))


def test_a_worker_s_traceback_and_stack_name_the_cell_as_its_prompt_does() -> None:
    with running_kernel() as (_, client):
        assert _numbered(client, "%load_ext nb_accel").status == "ok"  # In [1]
        assert _numbered(client, "%%distributed -n 2\nx = 1").status == "ok"  # In [2]
        failed = _numbered(client, "%%distributed\nx = 2\n1 / 0")  # In [3]
        traceback = "\n".join(failed.traceback)
        assert failed.ename == "ZeroDivisionError"
        assert "Cell In[3], line 3" in traceback and "In[4]" not in traceback
