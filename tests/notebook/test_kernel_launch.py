"""notebook_launcher as a notebook user meets it: through a real Jupyter kernel."""

from __future__ import annotations

import psutil
from kernel_driver import collect, run_cell, running_kernel, start_cell
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

DEFINE_AND_LAUNCH = """
import torch, torch.distributed as dist
from nb_accel import notebook_launcher, Accelerator

def train(scale):
    accelerator = Accelerator()
    value = torch.tensor([float(accelerator.process_index + 1)])
    dist.all_reduce(value)
    print("rank", accelerator.process_index, "sum", value.item())
    return value.item() * scale

results = notebook_launcher(train, args=(2.0,), num_processes=2)
print("results:", results)
"""

RAISE_CUSTOM = """
class ShapeMismatch(Exception):
    pass

def broken():
    if Accelerator().process_index == 1:
        raise ShapeMismatch("expected (8, 3), got (8, 4)")
    import time; time.sleep(60)

notebook_launcher(broken, num_processes=2)
"""


def test_function_defined_in_a_cell_runs_and_errors_keep_their_type() -> None:
    notebook = new_notebook(cells=[new_code_cell(DEFINE_AND_LAUNCH), new_code_cell(RAISE_CUSTOM)])
    NotebookClient(notebook, timeout=120, kernel_name="python3", allow_errors=True).execute()
    launch_out = "".join(  # streams, and the launch view's plain-text form (its title)
        o.get("text", "") or o.get("data", {}).get("text/plain", "") + "\n"
        for o in notebook.cells[0].outputs
    )
    assert "Launching 2 processes on CPU (gloo; fork)" in launch_out
    # Two ranks: every line carries its rank, from the first on.
    assert "[rank 0] rank 0 sum 3.0" in launch_out and "[rank 1] rank 1 sum 3.0" in launch_out
    assert "results: [6.0, 6.0]" in launch_out
    error = next(o for o in notebook.cells[1].outputs if o.output_type == "error")
    assert error.ename == "ShapeMismatch"
    assert error.evalue == "expected (8, 3), got (8, 4)"
    traceback = "\n".join(error.traceback)
    assert "Traceback from rank 1" in traceback and "Raised on rank 1 of 2" in traceback


SLEEPER = """
import time
from nb_accel import notebook_launcher

def sleeper():
    import torch.distributed as dist
    print(f"worker {dist.get_rank()} started", flush=True)
    time.sleep(120)

notebook_launcher(sleeper, num_processes=2)
"""

AFTERWARDS = """
import psutil
print("children:", len(psutil.Process().children(recursive=True)))
print("again:", notebook_launcher(lambda: 7, num_processes=2))
"""


def test_interrupt_stops_workers_and_the_next_launch_works() -> None:
    with running_kernel() as (manager, client):
        msg_id = start_cell(client, SLEEPER)
        collect(client, msg_id, until=("worker 0 started", "worker 1 started"))
        kernel = psutil.Process(manager.provisioner.process.pid)  # type: ignore[union-attr]
        assert len(kernel.children(recursive=True)) == 2
        manager.interrupt_kernel()
        interrupted = collect(client, msg_id)
        assert interrupted.status == "error" and interrupted.ename == "KeyboardInterrupt"
        after = run_cell(client, AFTERWARDS)
        assert "children: 0" in after.stdout
        assert "again: [7, 7]" in after.stdout


def test_kernel_shutdown_takes_the_workers_with_it() -> None:
    with running_kernel() as (manager, client):
        msg_id = start_cell(client, SLEEPER)
        collect(client, msg_id, until=("worker 0 started", "worker 1 started"))
        kernel = psutil.Process(manager.provisioner.process.pid)  # type: ignore[union-attr]
        workers = kernel.children(recursive=True)
        assert len(workers) == 2
    # The kernel is gone (killed outright); its workers must follow it.
    _gone, alive = psutil.wait_procs(workers, timeout=20)
    assert alive == []
