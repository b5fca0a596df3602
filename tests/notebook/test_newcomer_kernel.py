"""What a newcomer meets in a real kernel: a misspelled option answered with the one meant (the
launcher, the pool, the magics' flags); a worker's misuse shown as their own line and our
message, nb_accel's frames folded into one line; and a state dict with DDP's names, warned of
where the result arrives."""

from __future__ import annotations

import re

import pytest
from kernel_driver import CellRun, run_cell, running_kernel

ANSI = re.compile(r"\x1b\[[0-9;]*m")

SETUP = """
import os
import torch
from nb_accel import Accelerator, notebook_launcher
"""


def _shown(run: CellRun) -> str:
    return ANSI.sub("", "\n".join(run.traceback))


@pytest.mark.timeout(120)
def test_misspelled_options_name_the_option_meant() -> None:
    with running_kernel() as (_manager, client):
        run_cell(client, SETUP + "%load_ext nb_accel")
        launcher = run_cell(client, "notebook_launcher(print, num_process=2)")
        pool = run_cell(
            client, "from nb_accel.launch.pool import WorkerPool\nWorkerPool(num_process=2)"
        )
        cell = run_cell(client, "%%distributed --num-proceses 2\nx = 1")
        line = run_cell(client, "%distributed start --mixed-precison=bf16")
    for run in (launcher, pool):
        assert run.ename == "TypeError", run
        assert "unexpected keyword argument 'num_process' (did you mean 'num_processes'?)" in (
            _shown(run)
        )
        assert "_keywords.py" not in _shown(run)
    assert "(did you mean 'num_processes'?); see help(notebook_launcher)" in _shown(launcher)
    assert cell.ename == line.ename == "UsageError"
    assert "--num-proceses: did you mean --num-processes?" in cell.evalue
    assert "--mixed-precison: did you mean --mixed-precision?" in line.evalue


MISUSE = """
def train():
    accelerator = Accelerator(cpu=True)
    accelerator.save_state()

notebook_launcher(train, num_processes=2)
"""

IN_TORCH = """
def train():
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(3, 2))
    model(torch.ones(4, 5))

notebook_launcher(train, num_processes=2)
"""


@pytest.mark.timeout(150)
def test_a_workers_misuse_shows_the_users_line_and_folds_ours() -> None:
    with running_kernel() as (_manager, client):
        run_cell(client, SETUP)
        misuse = run_cell(client, MISUSE)
        in_torch = run_cell(client, IN_TORCH)
        run_cell(client, "os.environ['NB_ACCEL_FULL_TRACEBACKS'] = '1'")
        in_full = run_cell(client, MISUSE)
    text = _shown(misuse)
    assert misuse.ename == "ValueError" and "save_state needs an output_dir" in text
    assert "accelerator.save_state()" in text  # the user's line
    assert "frames of nb_accel left out: NB_ACCEL_FULL_TRACEBACKS=1 shows them]" in text
    assert "nb_accel/runtime" not in text
    # an error raised inside torch keeps every frame: what nb_accel handed torch may matter
    torch_text = _shown(in_torch)
    assert "mat1 and mat2 shapes cannot be multiplied" in torch_text
    assert "left out" not in torch_text and "torch/nn/modules/linear.py" in torch_text
    # on request, every frame
    full = _shown(in_full)
    assert "left out" not in full and "nb_accel/runtime/checkpoint/methods.py" in full


STATE_DICTS = """
def train(unwrap):
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(3, 2))
    return (accelerator.unwrap_model(model) if unwrap else model).state_dict()

wrapped = notebook_launcher(train, args=(False,), num_processes=2)
print(sorted(wrapped[0]))
"""


@pytest.mark.timeout(120)
def test_a_state_dict_with_ddps_names_is_warned_of_where_it_arrives() -> None:
    with running_kernel() as (_manager, client):
        run_cell(client, SETUP)
        wrapped = run_cell(client, STATE_DICTS)
        plain = run_cell(client, "plain = notebook_launcher(train, args=(True,), num_processes=2)")
        loaded = run_cell(client, "torch.nn.Linear(3, 2).load_state_dict(plain[0])")
    assert wrapped.status == "ok" and "['module.bias', 'module.weight']" in wrapped.stdout
    assert (
        'ranks 0, 1 returned state dicts whose keys all carry "module." '
        "(DistributedDataParallel's wrapper), which a fresh model's load_state_dict does not "
        "match: return accelerator.unwrap_model(model).state_dict() for plain keys"
    ) in wrapped.stderr
    assert "returned state dict" not in plain.stderr + plain.stdout
    assert loaded.status == "ok"


CELL_STATE_DICT = """%%distributed -n 2
import torch
from nb_accel import Accelerator
accelerator = Accelerator()
model = accelerator.prepare(torch.nn.Linear(3, 2))
wrapped = model.state_dict()
plain = accelerator.unwrap_model(model).state_dict()
model.state_dict()
"""


@pytest.mark.timeout(120)
def test_a_distributed_cell_or_pull_with_ddps_names_is_warned_of_too() -> None:
    with running_kernel() as (_manager, client):
        run_cell(client, SETUP + "%load_ext nb_accel")
        cell = run_cell(client, CELL_STATE_DICT)
        pulled = run_cell(client, "%distributed pull plain")
        pulled_wrapped = run_cell(client, "%distributed pull wrapped --ranks 1")
        run_cell(client, "%distributed stop")
    assert cell.status == "ok", cell
    assert "module.weight" in str(cell.results)
    assert 'rank 0 returned a state dict whose keys all carry "module."' in cell.stderr
    assert pulled.status == "ok" and "returned" not in pulled.stderr
    assert 'rank 1 returned a state dict whose keys all carry "module."' in (pulled_wrapped.stderr)


UNPICKLABLE_GLOBAL = """
import threading
log_lock = threading.Lock()

def log(text):
    with log_lock:
        print(text)

def train():
    log("started")

notebook_launcher(train, num_processes=2, start_method="spawn")
"""


@pytest.mark.timeout(120)
def test_under_spawn_a_global_that_cannot_travel_is_named() -> None:
    with running_kernel() as (_manager, client):
        run_cell(client, SETUP)
        run = run_cell(client, UNPICKLABLE_GLOBAL)
        children = run_cell(client, "import psutil\nlen(psutil.Process().children())")
    assert run.ename == "TypeError", run
    assert (
        "cannot send the global `log_lock` (a lock), which 'train' uses (through 'log'), "
        "to the workers"
    ) in run.evalue
    assert "create them inside the launched function instead" in run.evalue
    assert children.results[0]["text/plain"] == "0"  # nothing was started


SAME_WARNING_ON_EVERY_RANK = """
from nb_accel import FullyShardedDataParallelPlugin

def train():
    plugin = FullyShardedDataParallelPlugin(cpu_offload=True)  # nothing to offload on a CPU
    accelerator = Accelerator(fsdp_plugin=plugin)
    model = accelerator.prepare(torch.nn.Linear(4, 4))
    return accelerator.process_index

notebook_launcher(train, num_processes=2)
"""


@pytest.mark.timeout(120)
def test_a_warning_every_rank_would_give_is_said_once_at_the_users_line() -> None:
    with running_kernel() as (_manager, client):
        run_cell(client, SETUP)
        run = run_cell(client, SAME_WARNING_ON_EVERY_RANK)
    assert run.status == "ok", run
    said = "FSDPOptionWarning: FullyShardedDataParallelPlugin(cpu_offload): no effect"
    assert run.stderr.count(said) == 1, run.stderr  # rank 1 would say the same
    assert "model = accelerator.prepare(torch.nn.Linear(4, 4))" in run.stderr  # the user's line
    assert "nb_accel/" not in run.stderr, run.stderr
