"""%%distributed through a real kernel: state across cells, output, values, errors, interrupts,
syntax errors."""

from __future__ import annotations

import ast
import os
import re
import signal
import time
from pathlib import Path

import psutil
from jupyter_client.blocking import BlockingKernelClient
from jupyter_client.manager import KernelManager
from kernel_driver import CellRun, collect, run_answering, run_cell, running_kernel, start_cell
from markers import process_ended, wait_until


def _plain(run: CellRun) -> str:
    return "\n".join(str(r.get("text/plain", "")) for r in run.results)


def _ok(client: BlockingKernelClient, code: str) -> CellRun:
    run = run_cell(client, code)
    assert run.status == "ok", (run.ename, run.evalue, "\n".join(run.traceback))
    return run


def test_cells_share_state_stream_output_and_move_values() -> None:
    with running_kernel() as (_, client):
        _ok(client, "%load_ext nb_accel")
        first = _ok(
            client,
            "%%distributed -n 2\nimport torch\nx = torch.tensor([float(rank)])\n"
            "print('hello from', rank)",
        )
        assert "Started 2 processes on CPU" in first.stdout
        assert "hello from 0" in first.stdout and "hello from 1" not in first.stdout
        assert _plain(_ok(client, "%%distributed\nx + 1")) == "tensor([1.])"  # rank 0's value
        everyone = _ok(client, "%%distributed --all-ranks\nprint('all', rank, world_size)")
        assert "all 0 2" in everyone.stdout and "[rank 1] all 1 2" in everyone.stdout
        _ok(client, "%%distributed -o tens\nx * 10")
        assert "[tensor([0.]), tensor([10.])]" in _ok(client, "print(tens)").stdout
        _ok(client, "scale = 3\nshift = lambda v: v + 100\n%distributed push scale shift")
        assert _plain(_ok(client, "%%distributed\nshift(x * scale)")) == "tensor([100.])"
        pulled = _ok(client, "%distributed pull x")
        assert _plain(pulled) == "[tensor([0.]), tensor([1.])]"
        only = _ok(client, "%%distributed --ranks 1\nprint('only', rank)\nrank")
        assert "only 1" in only.stdout and _plain(only) == "1"
        status = _ok(client, "%distributed status")
        assert status.stdout.count(" yes ") == 2 and "cpu" in status.stdout


def test_an_error_names_its_rank_and_the_pool_lives_on() -> None:
    with running_kernel() as (_, client):
        _ok(client, "%load_ext nb_accel")
        _ok(client, "%%distributed -n 2\nkept = rank + 40\n" + SAY_WHEN_RECEIVING)
        failed = run_cell(
            client, "%%distributed\nif rank == 1:\n    raise KeyError('missing column')"
        )
        assert failed.status == "error" and failed.ename == "KeyError"
        traceback = "\n".join(failed.traceback)
        assert "Raised on rank 1 of 2" in traceback and "In[" in traceback
        assert _plain(_ok(client, "%%distributed\nkept")) == "40"  # namespace intact
        usage = run_cell(client, "%%distributed --ranks 5\nrank")
        assert usage.status == "error" and "not in this pool of 2" in usage.evalue


SLEEP = "%%distributed\nimport time\nnote = 'kept'\nprint('sleeping', flush=True)\ntime.sleep(60)"


def test_interrupt_stops_the_cell_on_every_rank_and_keeps_the_namespace() -> None:
    with running_kernel() as (manager, client):
        _ok(client, "%load_ext nb_accel")
        _ok(client, "%%distributed -n 2\nrank")
        # Every rank has started the cell before the interrupt (a rank still reading it is the
        # next test's case).
        msg_id = start_cell(client, SLEEP.replace("%%distributed", "%%distributed --all-ranks"))
        collect(client, msg_id, until=("[rank 0] sleeping", "[rank 1] sleeping"))
        manager.interrupt_kernel()
        interrupted = collect(client, msg_id)
        assert interrupted.status == "error" and interrupted.ename == "KeyboardInterrupt"
        after = _ok(client, "%%distributed -o notes\nnote")
        assert _ok(client, "print(notes)").stdout.strip() == "['kept', 'kept']"
        assert after.status == "ok"


def test_a_killed_worker_is_replaced_and_restart_brings_a_fresh_pool() -> None:
    with running_kernel() as (manager, client):
        _ok(client, "%load_ext nb_accel")
        _ok(client, "%%distributed -n 2\nkept = rank * 10")
        killed = run_cell(
            client,
            "%%distributed\nimport os, signal, time\n"
            "if rank == 1:\n    os.kill(os.getpid(), signal.SIGKILL)\ntime.sleep(30)",
        )
        assert killed.status == "error" and killed.ename == "WorkerDiedError"
        assert "rank 1" in killed.evalue and "SIGKILL" in killed.evalue
        shown = "\n".join(killed.traceback)
        assert "Rank 1 died and was replaced by a new process" in shown
        assert "The variables rank 1 held are gone" in shown
        assert "Rank 0 was interrupted by this failure and kept its variables." in shown
        assert "stopped by this failure" not in shown  # rank 0 lives on, with its state
        # the pool is whole again at once: rank 0 kept its variable, rank 1's is gone
        whole = "%%distributed -o found\nimport torch, torch.distributed as dist\n"
        whole += "t = torch.ones(1)\ndist.all_reduce(t)\n(t.item(), 'kept' in globals())"
        _ok(client, whole)
        assert _ok(client, "print(found)").stdout.strip() == "[(2.0, True), (2.0, False)]"
        _ok(client, "%distributed restart")
        assert _plain(_ok(client, "%%distributed -o ranks\nrank")) == ""
        assert _ok(client, "print(ranks)").stdout.strip() == "[0, 1]"
        kernel = psutil.Process(manager.provisioner.process.pid)  # type: ignore[union-attr]
        workers = kernel.children(recursive=True)
        assert len(workers) == 2
    # The kernel is gone; its pool must follow it.
    _gone, alive = psutil.wait_procs(workers, timeout=20)
    assert alive == []


#: Says "waiting" from a thread once the main thread is inside a receive (a collective).
SAY_WHEN_RECEIVING = """import sys, threading, time, torch, torch.distributed as dist
def say_when_receiving(main):
    while sys._current_frames()[main].f_code.co_name != "recv":
        time.sleep(0.01)
    print("waiting", flush=True)
def receive_from(source):
    threading.Thread(target=say_when_receiving, args=(threading.get_ident(),)).start()
    dist.recv(torch.zeros(1), src=source)
"""

#: Rank 1 waits in a collective that rank 0 (sleeping, so interruptible) never joins.
ONE_IN_A_COLLECTIVE = """%%distributed --all-ranks
if rank == 1:
    receive_from(0)
else:
    print("waiting", flush=True)
    time.sleep(60)
"""

#: Both ranks wait in a receive from the other: no interrupt reaches either.
BOTH_IN_A_COLLECTIVE = """%%distributed --all-ranks
receive_from(1 - rank)
"""


def _interrupted(manager: KernelManager, client: BlockingKernelClient, cell: str) -> CellRun:
    """Run ``cell``, interrupt the kernel once it printed "waiting", and return the cell's
    run, which must end with ``KeyboardInterrupt``."""
    msg_id = start_cell(client, cell)
    collect(client, msg_id, until=("[rank 0] waiting", "[rank 1] waiting"))
    manager.interrupt_kernel()
    interrupted = collect(client, msg_id)
    assert interrupted.status == "error" and interrupted.ename == "KeyboardInterrupt"
    return interrupted


def test_an_interrupt_while_a_rank_waits_in_a_collective_keeps_the_pool() -> None:
    with running_kernel() as (manager, client):
        _ok(client, "%load_ext nb_accel")
        _ok(client, "%%distributed -n 2\nkept = rank + 40\n" + SAY_WHEN_RECEIVING)
        _interrupted(manager, client, ONE_IN_A_COLLECTIVE)
        summed = _ok(
            client,
            "%%distributed -o sums\nimport torch, torch.distributed as dist\n"
            "value = torch.full((1,), float(rank + 1))\n"
            "dist.all_reduce(value)\n(value.item(), kept)",
        )
        assert "remade" in summed.stderr  # the interrupted rank released its group
        assert _plain(_ok(client, "sums")) == "[(3.0, 40), (3.0, 41)]"


def test_ranks_that_no_interrupt_reaches_are_named_and_the_pool_stopped() -> None:
    with running_kernel() as (manager, client):
        _ok(
            client,
            "%load_ext nb_accel\nimport nb_accel.launch.driver.driver as driver\n"
            "driver.INTERRUPT_GRACE_S = 2",
        )
        _ok(client, "%%distributed -n 2\n" + SAY_WHEN_RECEIVING)
        interrupted = _interrupted(manager, client, BOTH_IN_A_COLLECTIVE)
        assert "rank(s) [0, 1] did not stop" in interrupted.evalue
        for rank in (0, 1):  # where each one was
            where = f"rank {rank} is at `receive_from` (Cell In[1], line 9) ← `<module>` ("
            assert where in interrupted.evalue, interrupted.evalue
        assert "restart" in interrupted.evalue
        _ok(client, "%distributed restart")
        assert _plain(_ok(client, "%%distributed\nworld_size")) == "2"


def test_progress_and_metrics_show_up_in_a_distributed_cell() -> None:
    with running_kernel() as (_, client):
        _ok(client, "%load_ext nb_accel")
        plain = _ok(client, "%%distributed -n 2\nrank")
        assert not any("application/vnd.jupyter.widget-view+json" in r for r in plain.results)
        shown = _ok(
            client,
            "%%distributed\nfrom nb_accel import tqdm\n"
            "for i in tqdm(range(20)):\n    accelerator.log({'v': float(i)})",
        )
        widgets = [r for r in shown.results if "application/vnd.jupyter.widget-view+json" in r]
        assert widgets
        title = str(widgets[0].get("text/plain", ""))  # the view's title, a pool's cell's
        assert "%%distributed on 2 processes on CPU" in title and "Launching" not in title


def test_the_saved_configuration_sizes_the_pool(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("num_processes: 2\nmixed_precision: bf16\n")
    with running_kernel() as (_, client):
        _ok(client, f"import os\nos.environ['NB_ACCEL_CONFIG_FILE'] = {str(config)!r}")
        _ok(client, "%load_ext nb_accel")
        started = _ok(client, "%%distributed -o seen\n(world_size, accelerator.mixed_precision)")
        assert "Started 2 processes on CPU (gloo; fork, bf16 mixed precision)" in started.stdout
        assert _ok(client, "print(seen)").stdout.strip() == "[(2, 'bf16'), (2, 'bf16')]"


def test_rough_edges_get_clear_answers() -> None:
    with running_kernel() as (_, client):
        _ok(client, "%load_ext nb_accel")
        _ok(client, "%%distributed -n 2\nimport os, signal, threading\nlock = threading.Lock()")
        hidden = _ok(client, "%%distributed\nrank + 1;")
        assert hidden.results == []  # a trailing semicolon hides the value, as in IPython
        shown = _ok(client, "%%distributed\nrank + 1")
        assert _plain(shown) == "1" and "1" in _ok(client, "print(_)").stdout  # Out / _
        printed = _ok(
            client, "%%distributed\nfrom IPython.display import display\ndisplay('shown')"
        )
        assert printed.stdout == "shown\n"  # text, instead of a message the worker cannot send
        asked, prompts = run_answering(client, "%%distributed\ninput('name? ')", ["a", "b"])
        assert asked.status == "ok" and sorted(prompts) == ["[rank 0] name? ", "[rank 1] name? "]
        lock = run_cell(
            client, "import threading\nklock = threading.Lock()\n%distributed push klock"
        )
        assert lock.status == "error" and "cannot send klock to the workers" in lock.stderr
        mismatch = run_cell(client, "%%distributed --mixed-precision bf16\nrank")
        assert mismatch.status == "error"
        assert "%distributed restart --mixed-precision bf16" in mismatch.stderr
        _ok(client, "%%distributed -o pids\nos.getpid()")
        pids = ast.literal_eval(_ok(client, "print(pids)").stdout.strip())
        os.kill(pids[1], signal.SIGKILL)  # rank 1 dies between the cells
        wait_until(lambda: process_ended(pids[1]), "rank 1's death")
        gone = run_cell(client, "%%distributed\nrank")
        assert gone.ename == "WorkerDiedError" and "rank 1" in gone.evalue
        assert "not by the out-of-memory killer" in gone.evalue  # the user's kill -9
        assert "Rank 1 died and was replaced by a new process" in "\n".join(gone.traceback)
        assert "has stopped" not in _ok(client, "%distributed status").stdout
        assert _plain(_ok(client, "%%distributed\nrank")) == "0"
        _ok(client, "%distributed restart")
        _ok(client, "%reload_ext nb_accel")  # stops the pool instead of orphaning it
        assert "no pool" in _ok(client, "%distributed status").stdout


def _sigint_pending(pid: int) -> bool:
    """Whether a SIGINT waits to be delivered to the stopped process ``pid``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("SigPnd:", "ShdPnd:")) and int(line.split()[1], 16) & (
            1 << (signal.SIGINT - 1)
        ):
            return True
    return False


def test_an_interrupt_that_reaches_a_rank_still_reading_the_cell_stops_it_there() -> None:
    """On a busy machine a rank may get the interrupt before it has read the whole cell (here
    it is held stopped until the signal waits for it): the cell must not run there, and the
    pool lives on with its namespaces."""
    with running_kernel() as (manager, client):
        _ok(client, "%load_ext nb_accel")
        _ok(client, "import nb_accel.launch.driver.driver as driver\ndriver.INTERRUPT_GRACE_S = 5")
        _ok(client, "%%distributed -n 2\nimport os\npid = os.getpid()\nnote = 'kept'")
        _ok(client, "%%distributed -o pids\npid")
        pids = ast.literal_eval(_ok(client, "print(pids)").stdout.strip())
        os.kill(pids[1], signal.SIGSTOP)
        try:
            msg_id = start_cell(client, SLEEP.replace("import time", "import time\nstarted = 1"))
            collect(client, msg_id, until=("sleeping",))
            manager.interrupt_kernel()
            while not _sigint_pending(pids[1]):
                time.sleep(0.05)
        finally:
            os.kill(pids[1], signal.SIGCONT)
        interrupted = collect(client, msg_id)
        failure = (interrupted.ename, interrupted.evalue)
        assert interrupted.status == "error" and interrupted.ename == "KeyboardInterrupt", failure
        assert "did not stop" not in interrupted.evalue
        _ok(client, "%%distributed -o notes\nnote, globals().get('started')")
        # rank 1 never ran the cell it was reading; both namespaces are intact
        assert _ok(client, "print(notes)").stdout.strip() == "[('kept', 1), ('kept', None)]"


#: A handler the user registered for their own exceptions before loading the extension.
OWN_HANDLER = """
class Mine(Exception):
    pass
def shown_mine(self, etype, value, tb, tb_offset=None):
    print("handled by mine:", value)
get_ipython().set_custom_exc((Mine,), shown_mine)
"""


def test_a_syntax_error_in_a_cell_is_shown_as_in_any_cell_before_any_rank_starts() -> None:
    with running_kernel() as (_, client):
        _ok(client, OWN_HANDLER)
        _ok(client, "%load_ext nb_accel")
        failed = collect(
            client, client.execute("%%distributed -n 2\nx = 1\ny = (2,", store_history=True)
        )
        shown = "\n".join(failed.traceback)
        assert failed.ename == "SyntaxError" and "was never closed" in failed.evalue
        assert "Cell In[1], line 3" in _plain_text(shown) and "y = (2," in _plain_text(shown)
        for plumbing in ("magics.py", "interactiveshell", "ast.py", "run_cell_magic", "In[2]"):
            assert plumbing not in shown, shown
        assert "no pool" in _ok(client, "%distributed status").stdout  # nothing was started
        outside = collect(client, client.execute("%%distributed\nreturn 5", store_history=True))
        assert outside.ename == "SyntaxError" and "'return' outside function" in outside.evalue
        assert "Cell In[2], line 2" in _plain_text("\n".join(outside.traceback))
        assert "handled by mine: theirs" in run_cell(client, "raise Mine('theirs')").stdout


def _plain_text(text: str) -> str:
    """``text`` without its terminal colours."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)
