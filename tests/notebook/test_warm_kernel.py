"""Warm workers in a real kernel: a launch with ``reuse_workers=True`` and ``%%distributed``
cells run on the same workers, in either order; a resident a launch built is a variable of
the cells; ``%distributed stop`` ends them for both."""

from __future__ import annotations

import pytest
from kernel_driver import run_cell, running_kernel

SETUP = """
import os
import torch
import nb_accel
from nb_accel import notebook_launcher, resident
%load_ext nb_accel

def train(step):
    model = resident("model", lambda: torch.nn.Linear(2, 1))
    return os.getpid(), step, float(model.weight.sum())
"""


@pytest.mark.timeout(120)
def test_a_warm_launch_and_distributed_cells_share_the_workers() -> None:
    with running_kernel() as (_manager, client):
        run_cell(client, SETUP)
        launched = run_cell(
            client,
            "first = notebook_launcher(train, args=(1,), num_processes=2, reuse_workers=True)",
        )
        cell = run_cell(
            client,
            "%%distributed\nimport os\npid = os.getpid()\nweight = float(model.weight.sum())",
        )
        same = run_cell(
            client,
            "pids = %distributed pull pid\nweights = %distributed pull weight\n"
            "again = notebook_launcher(train, args=(2,), num_processes=2, reuse_workers=True)\n"
            "print([f[0] for f in first] == pids == [a[0] for a in again])\n"
            "print([f[2] for f in first] == weights == [a[2] for a in again])",
        )
        run_cell(client, "%distributed stop")
        started = run_cell(client, "%distributed start -n 2")
        pool_first = run_cell(
            client,
            "_ = get_ipython().run_cell_magic('distributed', '', 'import os\\npid = os.getpid()')\n"
            "pids = %distributed pull pid\n"
            "after = notebook_launcher(train, args=(3,), num_processes=2, reuse_workers=True)\n"
            "print([a[0] for a in after] == pids, pids != [f[0] for f in first])",
        )
        stopped = run_cell(
            client,
            "nb_accel.stop_workers()\nimport psutil\nprint('left', psutil.Process().children())",
        )
    assert launched.status == "ok" and "kept warm" in str(launched.results) + launched.stdout
    assert cell.status == "ok", cell
    assert same.stdout.split() == ["True", "True"], same
    assert started.status == "ok", started
    assert pool_first.stdout.split() == ["True", "True"], pool_first
    assert "On warm workers" in str(pool_first.results) + pool_first.stdout
    assert stopped.stdout.strip() == "left []"
