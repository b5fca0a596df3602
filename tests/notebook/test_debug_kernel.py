"""``%debug`` after a rank raised, in a real kernel whose prompts are answered through Jupyter's
stdin channel: the debugger opens on that rank's frames (its locals, its source), every pdb
command answers, ``%distributed debug RANK`` picks another failed rank, a cold launch keeps the
raising rank (only it) until the post-mortem ends or the next launch starts, and ``%debug``
after an ordinary error is still IPython's."""

from __future__ import annotations

from pathlib import Path

import pytest
from kernel_driver import collect, run_answering, run_cell, running_kernel

COLD_LAUNCH = """
import os, psutil
import torch
import torch.distributed as dist
from nb_accel import notebook_launcher

def train(scale):
    weights = torch.arange(4.0) * scale
    store = dist.distributed_c10d._get_default_store()
    total = torch.ones(1)
    dist.all_reduce(total)
    if dist.get_rank() == 1:
        raise ValueError(f"bad weights {weights.sum().item()}")
    dist.barrier()  # rank 0 waits here for rank 1, which will never come
    return os.getpid()

notebook_launcher(train, args=(3,), num_processes=2)
"""

CHILDREN = "sorted(p.pid for p in psutil.Process().children(recursive=True))"

#: In the kept rank's debugger: its group's store (a file store in the launch's folder) waits
#: 5 s at most, instead of the launch's timeout, for a file that is gone; then the probe.
STORE_WAITS_5_S = "p store.set_timeout(__import__('datetime').timedelta(seconds=5))"
STORE_PROBE = "p ('store', store.check(['x']))"

pytestmark = pytest.mark.timeout(240)

FAILING_CELL = """%%distributed -n 2
secret = 1000 + rank
def inner(value):
    doubled = value * 2
    raise ValueError(f"boom on rank {rank}")
if rank == 1:
    inner(secret)
"""

WARM_LAUNCH = """
import torch.distributed as dist
from nb_accel import notebook_launcher

def train(step):
    local_value = step * 10 + dist.get_rank()
    if dist.get_rank() == 1:
        raise RuntimeError("diverged")
    return local_value

notebook_launcher(train, args=(7,), num_processes=2, reuse_workers=True)
"""


def test_debug_after_a_failed_cell_opens_the_raising_ranks_frames() -> None:
    with running_kernel() as (_, client):
        assert run_cell(client, "import nb_accel\n%load_ext nb_accel").status == "ok"
        failed = run_cell(client, FAILING_CELL)
        assert failed.ename == "ValueError"
        assert "%debug opens the debugger on rank 1" in "\n".join(failed.traceback)
        run, prompts = run_answering(
            client, "%debug", ["p doubled, value", "u", "p secret", "ll", "q"]
        )
        assert run.status == "ok", run.stderr
        assert prompts == ["(Pdb rank 1) "] * 5
        assert "(2002, 1001)" in run.stdout  # the raising frame's locals
        assert "1001" in run.stdout.split("(2002, 1001)")[1]  # the cell's variable, one up
        assert "inner(secret)" in run.stdout  # ll: the cell's own source
        assert "pool_worker" not in run.stdout  # nb_accel's frames are left out
        again = run_cell(client, "%%distributed\nprint('still here', rank)")
        assert "still here 0" in again.stdout  # the pool lives on


def test_debug_after_a_failed_warm_launch_and_another_rank() -> None:
    with running_kernel() as (_, client):
        failed = run_cell(client, WARM_LAUNCH)
        assert failed.ename == "RuntimeError"
        run, prompts = run_answering(client, "%debug", ["p local_value", "c"])
        assert prompts == ["(Pdb rank 1) "] * 2 and "71" in run.stdout
        both = run_cell(
            client,
            "def both(step):\n    mine = step + dist.get_rank()\n    raise KeyError(mine)\n"
            "notebook_launcher(both, args=(5,), num_processes=2, reuse_workers=True)",
        )
        assert both.ename == "KeyError"
        run, prompts = run_answering(client, "%load_ext nb_accel\n%distributed debug 0", ["p mine"])
        assert prompts[0] == "(Pdb rank 0) " and "5" in run.stdout
        wrong = run_cell(client, "%distributed debug 7")
        assert "rank 7 did not raise" in wrong.stderr + wrong.evalue


WARM_LAUNCH_LEFT_WAITING = """
import torch
import torch.distributed as dist
from nb_accel import notebook_launcher

def train(scale):
    weights = torch.arange(4.0) * scale
    if dist.get_rank() == 1:
        raise ValueError(f"bad weights {weights.sum().item()}")
    dist.barrier()  # rank 0 waits here: rank 1's failure frees it, and the group is broken
    return 0

notebook_launcher(train, args=(3,), num_processes=2, reuse_workers=True)
"""

ALL_REDUCE = """
def total():
    value = torch.ones(1)
    dist.all_reduce(value)
    return value.item()

notebook_launcher(total, num_processes=2, reuse_workers=True)
"""


def test_debug_after_a_warm_launch_left_a_rank_waiting_says_nothing_of_cells() -> None:
    with running_kernel() as (_, client):
        failed = run_cell(client, WARM_LAUNCH_LEFT_WAITING)
        assert failed.ename == "ValueError"
        run, prompts = run_answering(client, "%debug", ["p weights.sum().item()", "q"])
        assert prompts == ["(Pdb rank 1) "] * 2 and "18.0" in run.stdout
        assert "process group" not in run.stderr, run.stderr  # the debugger needs no group
        again = run_cell(client, ALL_REDUCE)  # the next launch remakes the group, and says so
        assert again.status == "ok" and "[2.0, 2.0]" in str(again.results), again
        assert "The process group was remade after the previous failure" in again.stderr
        assert "cell" not in again.stderr


def test_debug_after_an_ordinary_error_is_ipythons() -> None:
    with running_kernel() as (_, client):
        run_cell(client, "import nb_accel\nlocal = 41")
        failed = run_cell(client, "def f():\n    here = local + 1\n    1 / 0\nf()")
        assert failed.ename == "ZeroDivisionError"
        run, prompts = run_answering(client, "%debug", ["p here", "q"])
        assert prompts and "rank" not in prompts[0] and "42" in run.stdout


def test_a_cold_launch_keeps_the_raising_rank_for_debug_and_then_nothing() -> None:
    with running_kernel() as (_, client):
        failed = run_cell(client, COLD_LAUNCH)
        assert failed.ename == "ValueError"
        assert "%debug opens the debugger on rank 1" in "\n".join(failed.traceback)
        kept = run_cell(client, f"print({CHILDREN})")
        assert kept.stdout.count(",") == 0 and kept.stdout.strip() != "[]"  # rank 1 only
        run, prompts = run_answering(
            client, "%debug", ["p weights", "where", STORE_WAITS_5_S, STORE_PROBE, "q"]
        )
        assert prompts == ["(Pdb rank 1) "] * 5, run.stderr
        assert "tensor([0., 3., 6., 9.])" in run.stdout
        assert "('store', False)" in run.stdout, (  # its group's store is still there
            "the kept rank's process-group store did not answer: the launch's folder was "
            f"removed before the rank was let go\n{run.stdout}"
        )
        assert "pool_worker" not in run.stdout and "entrypoint" not in run.stdout
        assert run_cell(client, f"print({CHILDREN})").stdout.strip() == "[]"  # ended with it
        again = run_cell(client, "%debug")  # its frames are gone: said, not IPython's debugger
        assert "no longer waits for %debug" in again.stderr + again.evalue

        run_cell(client, COLD_LAUNCH)  # kept again, then let go by the next launch
        ok = run_cell(client, "notebook_launcher(lambda: 1, num_processes=2)")
        assert ok.status == "ok"
        assert run_cell(client, f"print({CHILDREN})").stdout.strip() == "[]"


def test_a_cold_launch_keeps_nothing_when_told_not_to_wait(tmp_path: object) -> None:
    with running_kernel() as (_, client):
        path = str(tmp_path) + "/config.yaml"
        setup = f"import os\nos.environ['NB_ACCEL_CONFIG_FILE'] = {path!r}\n"
        setup += "from nb_accel import save_config, Config\nsave_config(Config(post_mortem_wait=0))"
        assert run_cell(client, setup).status == "ok", "the configuration could not be saved"
        failed = run_cell(client, COLD_LAUNCH)
        assert failed.ename == "ValueError" and "%debug opens" not in "\n".join(failed.traceback)
        assert run_cell(client, f"print({CHILDREN})").stdout.strip() == "[]"


BREAKPOINTS = """
import os, psutil
import torch
import torch.distributed as dist
from nb_accel import notebook_launcher

def train(kind):
    total = torch.ones(1) * (dist.get_rank() + 1)
    if kind == "breakpoint" and dist.get_rank() == 1:
        hidden = total.item() * 7
        breakpoint()
    if kind == "distributed":
        seen = total.item() + 100
        dist.breakpoint(rank=0)
    dist.all_reduce(total)
    return total.item()
"""


def test_breakpoints_in_a_launch_stop_that_rank_in_the_notebook() -> None:
    with running_kernel() as (_, client):
        assert run_cell(client, BREAKPOINTS).status == "ok"
        run, prompts = run_answering(
            client,
            "print(notebook_launcher(train, args=('breakpoint',), num_processes=2))",
            ["p hidden", "c"],
        )
        assert run.status == "ok", run.stderr + run.evalue
        assert prompts == ["(Pdb rank 1) "] * 2 and "14.0" in run.stdout
        assert "[3.0, 3.0]" in run.stdout  # continued to the right result

        run, prompts = run_answering(
            client,
            "print(notebook_launcher(train, args=('distributed',), num_processes=2))",
            ["p seen", "n", "c"],
        )
        assert run.status == "ok", run.stderr + run.evalue
        assert prompts == ["(Pdb rank 0) "] * 3 and "101.0" in run.stdout
        assert "dist.all_reduce(total)" in run.stdout  # stopped in train, not in nb_accel
        assert "[3.0, 3.0]" in run.stdout

        run, prompts = run_answering(
            client, "notebook_launcher(train, args=('breakpoint',), num_processes=2)", ["q"]
        )
        assert run.ename == "DebuggerQuit" and "q in the debugger on rank 1" in run.evalue
        notes = run_cell(client, "import sys\nprint(getattr(sys.last_value, '__notes__', []))")
        assert "%debug opens" not in notes.stdout  # nothing to inspect after q
        assert run_cell(client, f"print({CHILDREN})").stdout.strip() == "[]"


def test_a_breakpoint_held_past_the_launch_timeout_continues_to_the_result() -> None:
    """Rank 0 waits in its all_reduce while rank 1 sits at its prompt for three times the
    launch's collective timeout: time at the prompt does not count, the launch goes on."""
    with running_kernel() as (_, client):
        assert run_cell(client, BREAKPOINTS).status == "ok"
        run, prompts = run_answering(
            client,
            "print(notebook_launcher(train, args=('breakpoint',), num_processes=2, timeout=2))",
            ["p hidden", "c"],
            hold_s=6.0,
        )
        assert run.status == "ok", run.stderr + run.evalue
        assert prompts == ["(Pdb rank 1) "] * 2 and "14.0" in run.stdout
        assert "[3.0, 3.0]" in run.stdout
        # and the timeout still holds where nobody is at a prompt
        late = run_cell(
            client,
            "import time\ndef late():\n    if dist.get_rank() == 1:\n        time.sleep(30)\n"
            "    dist.barrier()\nnotebook_launcher(late, num_processes=2, timeout=2)",
        )
        assert late.ename == "CollectiveTimeoutError", late.evalue
        assert "timed out after 2 s on rank 0 of 2" in late.evalue


#: A pool whose collective timeout is 2 s (the saved configuration's), and a cell whose rank 1
#: stops at a breakpoint while rank 0 waits for it in an all_reduce.
SHORT_TIMEOUT_POOL = """
import os
from nb_accel.config import Config, save_config
os.environ["NB_ACCEL_CONFIG_FILE"] = {path!r}
save_config(Config(timeout=2.0, cpu=True), {path!r})
%load_ext nb_accel
"""
BREAKPOINT_CELL = """%%distributed -n 2
import time
import torch, torch.distributed as dist
total = torch.ones(1) * (rank + 1)
if rank == 1:
    hidden = total.item() * 7
    breakpoint()
dist.all_reduce(total)
print('sum', total.item())
"""


def test_a_breakpoint_held_past_the_pools_timeout_continues_and_the_timeout_holds(
    tmp_path: Path,
) -> None:
    """The same in a %%distributed cell: the pool's ranks keep its timeout themselves; past it
    without a prompt, the cell fails with the timeout and the pool goes on."""
    with running_kernel() as (_, client):
        setup = run_cell(client, SHORT_TIMEOUT_POOL.format(path=str(tmp_path / "config.yaml")))
        assert setup.status == "ok", setup.evalue
        run, prompts = run_answering(client, BREAKPOINT_CELL, ["p hidden", "c"], hold_s=6.0)
        assert run.status == "ok", run.stderr + run.evalue
        assert prompts == ["(Pdb rank 1) "] * 2 and "14.0" in run.stdout
        assert "sum 3.0" in run.stdout
        late = run_cell(
            client, "%%distributed\nif rank == 1:\n    time.sleep(4)\ndist.all_reduce(total)"
        )
        assert late.ename == "CollectiveTimeoutError", late.evalue
        assert "timed out after 2 s on rank 0 of 2" in late.evalue
        again = run_cell(
            client,
            "%%distributed\ntotal = torch.ones(1)\ndist.all_reduce(total)\n"
            "print('again', total.item())",
        )
        assert "again 2.0" in again.stdout, again.stderr + again.evalue


def test_input_in_a_cell_is_asked_in_the_notebook_rank_by_rank() -> None:
    with running_kernel() as (_, client):
        run_cell(client, "%load_ext nb_accel")
        run, prompts = run_answering(
            client, "%%distributed -n 2\nname = input('name? ')\nprint(rank, name)", ["ada", "bob"]
        )
        assert run.status == "ok", run.stderr + run.evalue
        assert sorted(prompts) == ["[rank 0] name? ", "[rank 1] name? "]
        names = run_cell(client, "%%distributed --all-ranks\nprint(name)").stdout
        assert "ada" in names and "bob" in names
        # A front end that takes no input: input() fails at once on the rank, the pool lives on
        request = client.execute(
            "%%distributed\ninput('x')", store_history=False, allow_stdin=False
        )
        refused = collect(client, request)
        assert refused.ename == "EOFError" and "got no answer" in refused.evalue
        assert "does not take input" in refused.stderr
        assert run_cell(client, "%%distributed\nprint('on', rank)").stdout.strip() == "on 0"


STUCK_AFTER_RAISING = """
import time, psutil
import nb_accel.launch.debugging.kept_rank as kept_rank
import nb_accel.worker.process.lifecycle as lifecycle
from nb_accel import notebook_launcher

kept_rank.FIRST_WORDS_S = 3.0

def train():
    lifecycle.let_go_of_process_group = lambda: time.sleep(600)  # it hangs on its way to pdb
    raise ValueError("stuck")

notebook_launcher(train, num_processes=1)
"""


def test_a_kept_rank_that_never_shows_the_debugger_is_said_and_stopped() -> None:
    with running_kernel() as (_, client):
        failed = run_cell(client, STUCK_AFTER_RAISING)
        assert failed.ename == "ValueError"
        run, prompts = run_answering(client, "%debug", ["p 1"])
        assert prompts == []
        assert "did not open the debugger within 3 s" in run.stderr + run.evalue
        assert run_cell(client, f"print({CHILDREN})").stdout.strip() == "[]"


def test_a_caught_launch_error_leaves_no_rank_waiting() -> None:
    """The cell catches the launch's error: the rank kept for ``%debug`` is let go as the cell
    ends; one whose error reaches the notebook waits, and its error says for how long."""
    with running_kernel() as (_, client):
        caught = run_cell(
            client,
            COLD_LAUNCH.replace(
                "notebook_launcher(train, args=(3,), num_processes=2)",
                "try:\n    notebook_launcher(train, args=(3,), num_processes=2)\n"
                "except ValueError as error:\n    print('caught:', error)",
            ),
        )
        assert caught.status == "ok" and "caught: bad weights" in caught.stdout
        assert run_cell(client, f"print({CHILDREN})").stdout.strip() == "[]"
        failed = run_cell(client, COLD_LAUNCH)
        shown = "\n".join(failed.traceback)
        assert "Rank 1 waits for it up to 10 min (the saved setting post_mortem_wait)" in shown
        kept = run_cell(client, f"print({CHILDREN})")  # a cell after it: the rank still waits
        assert kept.stdout.strip() != "[]"
        run, prompts = run_answering(client, "%debug", ["p weights", "q"])
        assert prompts == ["(Pdb rank 1) "] * 2 and "tensor([0., 3., 6., 9.])" in run.stdout
