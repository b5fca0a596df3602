"""``%debug`` after a launch on SSH hosts failed, in a real kernel: the rank that raised waits
on its host (its host's node process and agent left running for it, the other host stopped),
the debugger opens on its frames there, its prompts answered through Jupyter's stdin channel;
the post-mortem's end, or the next launch, stops it, and nothing is left on the hosts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kernel_driver import run_answering, run_cell, running_kernel
from markers import wait_until
from ssh_hosts import SshMachines, require_ssh_machines

pytestmark = pytest.mark.timeout(300)

#: Rank 3 (on node1) raises after a first collective; the others then wait for it in the next.
FAILING_LAUNCH = """
import socket
import torch
import torch.distributed as dist
from nb_accel import notebook_launcher

ON_HOSTS = dict(num_processes=2, cpu=True, hosts=["node0", "node1"], ssh_config={config!r})

def train(scale):
    weights = torch.arange(4.0) * scale
    total = torch.ones(1)
    dist.all_reduce(total)
    if dist.get_rank() == 3:
        raise ValueError(f"bad weights {{weights.sum().item()}}")
    dist.barrier()  # the others wait here for rank 3, which will never come
    return dist.get_rank()

notebook_launcher(train, args=(3,), **ON_HOSTS)
"""


@pytest.fixture
def machines(tmp_path: Path, request: pytest.FixtureRequest) -> SshMachines:
    """Two SSH hosts, ``node0`` and ``node1``, in the test's ``ssh_config``."""
    require_ssh_machines()
    return SshMachines(tmp_path, request.addfinalizer)


def _on(machines: SshMachines, host: str) -> list[str]:
    """The launch's processes on ``host`` now."""
    return [line for line in machines.processes() if line.startswith(f"{host}: ")]


def test_debug_opens_on_the_raising_rank_on_its_host_and_then_nothing_is_left(
    machines: SshMachines,
) -> None:
    launch = FAILING_LAUNCH.format(config=str(machines.ssh_config))
    with running_kernel() as (_, client):
        failed = run_cell(client, launch)
        assert failed.ename == "ValueError", failed.stderr + failed.evalue
        assert "%debug opens the debugger on rank 3" in "\n".join(failed.traceback)
        wait_until(lambda: _on(machines, "node0") == [], "the other host's end")
        assert _on(machines, "node1"), "rank 3's host was not left running for %debug"

        network = "p __import__('os').readlink('/proc/self/ns/net')"  # the rank's machine's
        run, prompts = run_answering(client, "%debug", ["p weights", network, "q"])
        assert prompts == ["(Pdb rank 3) "] * 3, run.stdout + run.stderr
        assert "tensor([0., 3., 6., 9.])" in run.stdout, run.stdout
        here = os.readlink("/proc/self/ns/net")
        assert "'net:[" in run.stdout and f"'{here}'" not in run.stdout, run.stdout  # on node1
        assert "node_worker" not in run.stdout  # the user's frames, not the worker's
        machines.settle()
        assert machines.processes() == []  # the post-mortem's end stopped its host
        again = run_cell(client, "%debug")  # its frames are gone: said, not IPython's debugger
        assert "no longer waits for %debug" in again.stderr + again.evalue

        run_cell(client, launch)  # kept again, then let go by the next launch
        ok = run_cell(client, "print(notebook_launcher(lambda: 1, **ON_HOSTS))")
        assert ok.status == "ok" and "[1, 1, 1, 1]" in ok.stdout, ok.stderr + ok.evalue
    machines.settle()
    assert machines.processes() == []
