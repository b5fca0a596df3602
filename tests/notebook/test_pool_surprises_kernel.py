"""%%distributed without surprises, through a real kernel: a pool started without ``-n`` on the
CPU says why it runs one process; a cell with another ``-n`` restarts the running pool with
that many, saying so, and leaves no old worker behind; the error of a rank replaced after its
death names the variables the other ranks hold that the new process lacks."""

from __future__ import annotations

import ast
import os
import re
import signal

import psutil
import pytest
from jupyter_client.blocking import BlockingKernelClient
from jupyter_client.manager import KernelManager
from kernel_driver import CellRun, run_cell, running_kernel
from markers import process_ended, wait_until


def _ok(client: BlockingKernelClient, code: str) -> CellRun:
    run = run_cell(client, code)
    assert run.status == "ok", (run.ename, run.evalue, "\n".join(run.traceback))
    return run


def _printed(client: BlockingKernelClient, name: str) -> object:
    """The kernel variable ``name``, as printed there and read back."""
    return ast.literal_eval(_ok(client, f"print({name})").stdout.strip())


def _workers(manager: KernelManager) -> list[psutil.Process]:
    """The kernel's worker processes (a forked pool's: its only children)."""
    kernel = psutil.Process(manager.provisioner.process.pid)  # type: ignore[union-attr]
    return kernel.children(recursive=True)


def _plain_text(lines: list[str]) -> str:
    """A traceback's lines as text, without their terminal colours."""
    return re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(lines))


@pytest.mark.timeout(150)
def test_a_pool_started_without_n_on_the_cpu_says_why_it_runs_one_process() -> None:
    with running_kernel() as (_, client):  # the run's saved configuration is empty
        _ok(client, "%load_ext nb_accel")
        started = _ok(client, "%%distributed\nworld_size")
        assert (
            "Started 1 process on CPU (gloo; fork) for %%distributed: 1 process" in started.stdout
        )
        why = re.search(r"1 process because (.*) and no -n was given;", started.stdout)
        assert why is not None, started.stdout
        assert why.group(1) in ("this machine has no GPU", "it runs on the CPU")
        assert "%%distributed -n 4 starts 4, or save num_processes" in started.stdout
        _ok(client, "%distributed stop")
        asked = _ok(client, "%%distributed -n 1\nworld_size")  # asked for: nothing to explain
        assert "Started 1 process on CPU (gloo; fork) for %%distributed\n" in asked.stdout
        assert "because" not in asked.stdout


@pytest.mark.timeout(180)
def test_another_n_restarts_the_running_pool_saying_so_and_leaves_no_worker_behind() -> None:
    with running_kernel() as (manager, client):
        _ok(client, "%load_ext nb_accel")
        _ok(client, "%%distributed -n 2\nimport os\nkept = 1")
        _ok(client, "%%distributed -o old\nos.getpid()")
        old = _printed(client, "old")
        assert isinstance(old, list) and len(old) == 2
        resized = _ok(client, "%%distributed -n 3 -o seen\n(world_size, 'kept' in globals())")
        assert (
            "The pool had 2 processes; restarting it with 3 for -n 3 (the variables its ranks "
            "held are lost)" in resized.stderr
        ), resized.stderr
        assert "Started 3 processes on CPU" in resized.stdout
        assert _printed(client, "seen") == [(3, False)] * 3
        assert all(process_ended(pid) for pid in old)  # stopped before the new ones started
        workers = _workers(manager)
        assert len(workers) == 3 and not {w.pid for w in workers} & set(old)
        same = _ok(client, "%%distributed -n 3\nrank")  # the pool's own -n: no restart
        assert "restarting" not in same.stderr
        refused = run_cell(client, "%%distributed -n 2 --mixed-precision bf16\nrank")
        assert refused.status == "error"
        assert "%distributed restart -n 2 --mixed-precision bf16" in refused.stderr
        assert {w.pid for w in _workers(manager)} == {w.pid for w in workers}  # still running
    _gone, alive = psutil.wait_procs(workers, timeout=20)  # the kernel's end ends them
    assert alive == []


#: A cell that defines what a training notebook holds on every rank.
DEFINE = """%%distributed -n 3
import os, torch
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = [torch.ones(2)]
__private__ = 1
"""

#: Rank 2 dies in the middle of a cell that the others run on.
DIES_DURING = """%%distributed
import signal, time
during = 1
if rank == 2:
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(60)
"""


@pytest.mark.timeout(240)
def test_a_replaced_rank_names_the_variables_the_others_hold_that_it_lacks() -> None:
    with running_kernel() as (manager, client):
        _ok(client, "%load_ext nb_accel")
        _ok(client, DEFINE)
        _ok(client, "%%distributed --ranks 0\nfirst_only = 1")
        _ok(client, "%%distributed -o pids\nos.getpid()")
        pids = _printed(client, "pids")
        assert isinstance(pids, list)
        os.kill(pids[1], signal.SIGKILL)  # rank 1 dies between two cells
        wait_until(lambda: process_ended(pids[1]), "rank 1's death")
        between = run_cell(client, "%%distributed\nrank")
        assert between.ename == "WorkerDiedError", between
        shown = _plain_text(between.traceback)
        assert (
            "Rank 1 is new: it lacks `model`, `optimizer`, `loader` that ranks 0, 2 hold and "
            "`first_only` that rank 0 holds; run the cells that define them again." in shown
        ), shown
        during = run_cell(client, DIES_DURING)  # rank 2 dies while the others run the cell
        assert during.ename == "WorkerDiedError", during
        shown = _plain_text(during.traceback)
        assert (
            "Rank 2 is new: it lacks `model`, `optimizer`, `loader`, `first_only` that rank 0 "
            "holds and `during` that ranks 0, 1 hold; run the cells that define them again."
            in shown
        ), shown
        again = _ok(
            client, "%%distributed -o lacking\n[n for n in ('model', 'during') if n in globals()]"
        )
        assert "is new" not in again.stderr  # said once, with the death
        assert _printed(client, "lacking") == [["model", "during"], ["during"], []]
        workers = _workers(manager)
        assert len(workers) == 3
    _gone, alive = psutil.wait_procs(workers, timeout=20)  # the kernel's end ends them
    assert alive == []
