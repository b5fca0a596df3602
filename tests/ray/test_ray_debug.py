"""``%debug`` after a launch on the Ray cluster failed, in a real Jupyter kernel on the head
node, its prompts answered through Jupyter's stdin channel: the rank that raised waits on its
node (its node actor, node process and the launch's placement group kept for it), the debugger
opens on its frames there, and the post-mortem's end leaves nothing on either node, the
placement group removed."""

from __future__ import annotations

import pytest
from kernel_driver import run_answering, run_cell, running_kernel
from ray_cluster import RayCluster

pytestmark = pytest.mark.timeout(240)

#: Rank 3 (on the other node) raises after a first collective; the others then wait for it.
FAILING_LAUNCH = """
import torch
import torch.distributed as dist
from nb_accel import notebook_launcher

def train(scale):
    weights = torch.arange(4.0) * scale
    total = torch.ones(1)
    dist.all_reduce(total)
    if dist.get_rank() == 3:
        raise ValueError(f"bad weights {weights.sum().item()}")
    dist.barrier()  # the others wait here for rank 3, which will never come
    return dist.get_rank()

notebook_launcher(train, args=(3,), num_processes=2, hosts="ray")
"""

#: The cluster's placement groups that still hold resources.
GROUPS = """
import ray
print(sorted(g["state"] for g in ray.util.placement_group_table().values()
             if g["state"] != "REMOVED"))
"""


def test_debug_opens_on_the_raising_rank_on_its_ray_node(ray_cluster: RayCluster) -> None:
    folder = ray_cluster.kernels / "debug"
    folder.mkdir()
    scratch = folder / "scratch"
    scratch.mkdir()
    head = ray_cluster.head.address
    wrap = ray_cluster.on_head([])
    with running_kernel(folder, scratch, None, wrap, head) as (_, client):
        failed = run_cell(client, FAILING_LAUNCH)
        assert failed.ename == "ValueError", failed.stderr + failed.evalue
        assert "%debug opens the debugger on rank 3" in "\n".join(failed.traceback)
        assert run_cell(client, GROUPS).stdout.strip() == "['CREATED']"  # kept for the rank

        network = "p __import__('socket').gethostname()"
        run, prompts = run_answering(client, "%debug", ["p weights", network, "q"])
        assert prompts == ["(Pdb rank 3) "] * 3, run.stdout + run.stderr
        assert "tensor([0., 3., 6., 9.])" in run.stdout and "'raynode1'" in run.stdout, run.stdout
        assert run_cell(client, GROUPS).stdout.strip() == "[]"  # let go with the rank
    ray_cluster.settle(30)  # Ray ends the actors' processes just after
    assert ray_cluster.processes() == []
