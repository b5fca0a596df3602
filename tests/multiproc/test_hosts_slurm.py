"""Launches across the nodes of a SLURM allocation (``hosts="slurm"``): a real cluster on one
machine (``slurmctld``, a ``slurmd`` per network namespace, ``munge``); the kernel runs inside
``salloc -N 2`` and starts a node process on each node with ``srun``. Results in rank order,
big values (above the shared-memory threshold) to the nodes and back, a failure naming its
node, a killed rank, an interrupt, a pool spread over the nodes; nothing left on the nodes
after any of them, nor after the kernel dies."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import psutil
import pytest
from slurm_cluster import SlurmCluster, require_slurm_cluster

pytestmark = pytest.mark.timeout(300)

#: The kernel: a launch over the allocation's nodes, its outcome printed as JSON.
KERNEL = """
import json, sys
from pathlib import Path
import torch
from nb_accel import notebook_launcher
from nb_accel.worker.transfer.segments import SHARE_MIN_BYTES

def summed(folder, failing, big):
    import socket, threading
    import torch, torch.distributed as dist
    value = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(value)
    if folder:  # wait there, for the test to kill the kernel
        Path(folder, f"rank{dist.get_rank()}").touch()
        threading.Event().wait(600)
    if dist.get_rank() == failing:
        raise KeyError(f"only on rank {dist.get_rank()}")
    return dist.get_rank(), value.item(), big * (dist.get_rank() + 1)

big = torch.arange(2 * SHARE_MIN_BYTES // 8, dtype=torch.float64)  # aside from the pickle
try:
    arguments = (sys.argv[1], int(sys.argv[2]), big)
    results = notebook_launcher(summed, arguments, num_processes=2, cpu=True, hosts="slurm")
    back = [[rank, value, scaled.equal(big * (rank + 1))] for rank, value, scaled in results]
    print("OUTCOME", json.dumps({"results": back}))
except KeyError as error:
    print("OUTCOME", json.dumps({"error": str(error), "notes": error.__notes__}))
"""


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> SlurmCluster:
    """Two SLURM nodes, ``sn0`` and ``sn1``."""
    require_slurm_cluster()
    return SlurmCluster(tmp_path, request.addfinalizer)


def _outcome(cluster: SlurmCluster, tmp_path: Path, failing_rank: int) -> dict[str, object]:
    script = tmp_path / "kernel.py"
    script.write_text(KERNEL)
    done = cluster.in_allocation(script, "", str(failing_rank))
    lines = [line for line in done.stdout.splitlines() if line.startswith("OUTCOME ")]
    assert lines, done.stdout + done.stderr
    outcome: dict[str, object] = json.loads(lines[-1].removeprefix("OUTCOME "))
    outcome["stdout"] = done.stdout
    return outcome


def test_the_allocation_s_nodes_train_together(cluster: SlurmCluster, tmp_path: Path) -> None:
    """Each rank gets a big tensor (above the shared-memory threshold) and sends one back:
    the nodes share no ``/dev/shm`` with the kernel."""
    outcome = _outcome(cluster, tmp_path, failing_rank=-1)
    assert outcome.get("results") == [[rank, 10.0, True] for rank in range(4)], outcome
    assert "on each of 2 hosts over srun (sn0, sn1), 4 ranks" in str(outcome["stdout"])
    assert cluster.processes() == []


def test_a_failure_names_its_rank_and_node(cluster: SlurmCluster, tmp_path: Path) -> None:
    outcome = _outcome(cluster, tmp_path, failing_rank=2)
    assert outcome.get("error") == "'only on rank 2'", outcome
    assert "Raised on rank 2 of 4 (host sn1)" in "\n".join(outcome["notes"])  # type: ignore[arg-type]
    assert cluster.processes() == []


def test_a_kernel_that_dies_leaves_nothing_on_the_nodes(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    script = tmp_path / "kernel.py"
    script.write_text(KERNEL)
    allocation = cluster.start_in_allocation(script, str(tmp_path), "-1")
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"rank{rank}").exists() for rank in range(4)):
            assert allocation.poll() is None and time.monotonic() < deadline, "no launch"
            time.sleep(0.05)
        for kernel in psutil.Process(allocation.pid).children():  # the python inside salloc
            kernel.kill()
        allocation.wait(60)
    finally:
        if allocation.poll() is None:
            allocation.kill()
            allocation.wait()
    cluster.settle()  # the srun clients died with it; SLURM ends the steps
    assert cluster.processes() == []
    # the steps themselves end before the cluster stops (its teardown fails otherwise); the
    # scratch folders of the tasks SLURM killed outright go with each node's own /dev/shm


#: A kernel for the other cases (``sys.argv[1]``): a rank killed, an interrupt, a pool. The
#: outcome is printed as JSON; the kernel then waits, inside its allocation, until the test
#: has looked at the nodes (the file ``checked`` in ``sys.argv[2]``).
CASES = """
import json, os, signal, sys, threading, time
from pathlib import Path
from nb_accel import notebook_launcher

case, folder = sys.argv[1], Path(sys.argv[2])

def killed_on_rank_two():
    import torch.distributed as dist
    if dist.get_rank() == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()

def killed_on_rank_two_at_first():
    import torch.distributed as dist
    if dist.get_rank() == 2 and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()
    return os.environ["TORCHELASTIC_RESTART_COUNT"]

def waits(folder):
    import torch.distributed as dist
    Path(folder, f"rank{dist.get_rank()}").touch()
    threading.Event().wait(600)

def interrupt_once_every_rank_waits():
    while not all((folder / f"rank{rank}").exists() for rank in range(4)):
        time.sleep(0.05)  # polling for the ranks' marks
    os.kill(os.getpid(), signal.SIGINT)

def asks():
    import torch.distributed as dist
    return input("name? ") if dist.get_rank() == 3 else ""

def pool():
    import torch
    from nb_accel.launch.pool import WorkerPool, load_value
    from nb_accel.worker.transfer.segments import SHARE_MIN_BYTES
    workers = WorkerPool(2, cpu=True, hosts="slurm")
    workers.start()
    try:
        code = "import torch, torch.distributed as dist\\nt = torch.ones(1)\\ndist.all_reduce(t)\\n"
        done = workers.execute(code + "(rank, t.item())", want_value=True)
        big = torch.arange(2 * SHARE_MIN_BYTES // 8, dtype=torch.float64)  # aside from the pickle
        workers.push({"big": big})
        workers.execute("scaled = big * (rank + 1)")
        pulled = workers.pull("scaled")
        try:
            workers.execute("if rank == 3:\\n    raise KeyError('on rank 3')\\ndist.barrier()")
        except KeyError as error:
            failure = error.__notes__
        return {
            "results": [load_value(reply) for _, reply in sorted(done.items())],
            "hosts": [status.host for status in workers.status()],
            "failure": failure,
            "big": [value.equal(big * (rank + 1)) for rank, value in enumerate(pulled)],
        }
    finally:
        workers.stop()

try:
    if case == "kill":
        notebook_launcher(killed_on_rank_two, num_processes=2, cpu=True, hosts="slurm")
    elif case == "restart":
        import contextlib, io
        shown = io.StringIO()
        with contextlib.redirect_stderr(shown):
            attempts = notebook_launcher(
                killed_on_rank_two_at_first,
                num_processes=2,
                cpu=True,
                hosts="slurm",
                max_restarts=1,
            )
        print("OUTCOME", json.dumps({"results": attempts, "shown": shown.getvalue()}), flush=True)
    elif case == "interrupt":
        threading.Thread(target=interrupt_once_every_rank_waits, daemon=True).start()
        notebook_launcher(waits, (str(folder),), num_processes=2, cpu=True, hosts="slurm")
    elif case == "prompt":
        import builtins
        asked = []
        builtins.input = lambda prompt="": asked.append(prompt) or "ada"  # what the user types
        answers = notebook_launcher(asks, num_processes=2, cpu=True, hosts="slurm")
        print("OUTCOME", json.dumps({"results": answers, "asked": asked}), flush=True)
    else:
        print("OUTCOME", json.dumps(pool()), flush=True)
except BaseException as error:
    print("OUTCOME", json.dumps({"type": type(error).__name__, "error": str(error)}), flush=True)
(folder / "outcome").touch()
while not (folder / "checked").exists():
    time.sleep(0.05)  # polling for the test's word
"""


def _case(cluster: SlurmCluster, tmp_path: Path, case: str) -> tuple[dict[str, object], list[str]]:
    """Run ``case`` in a kernel inside an allocation: its outcome, and what ran on the nodes
    once the kernel had its outcome (still inside the allocation)."""
    script = tmp_path / "cases.py"
    script.write_text(CASES)
    allocation = cluster.start_in_allocation(script, case, str(tmp_path), capture=True)
    try:
        deadline = time.monotonic() + 200
        while not (tmp_path / "outcome").exists():
            assert allocation.poll() is None and time.monotonic() < deadline, "no outcome"
            time.sleep(0.05)  # polling for the kernel's mark
        left = cluster.processes()
        (tmp_path / "checked").touch()
        out, err = allocation.communicate(timeout=60)
    finally:
        if allocation.poll() is None:
            allocation.kill()
            allocation.communicate()
    lines = [line for line in out.splitlines() if line.startswith("OUTCOME ")]
    assert lines, out + err
    return json.loads(lines[-1].removeprefix("OUTCOME ")), left


def test_a_killed_rank_is_named_with_its_node(cluster: SlurmCluster, tmp_path: Path) -> None:
    outcome, left = _case(cluster, tmp_path, "kill")
    assert outcome["type"] == "WorkerDiedError", outcome
    assert re.search(r"rank 2 \(pid \d+ on sn1\) was killed by SIGKILL", str(outcome["error"]))
    assert left == []


def test_a_killed_rank_restarts_the_allocation_s_workers(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    outcome, left = _case(cluster, tmp_path, "restart")
    assert outcome.get("results") == ["1"] * 4, outcome  # every rank of the second attempt
    assert "restart 1 of 1 after rank 2 was killed by SIGKILL" in str(outcome["shown"])
    assert left == []


def test_an_interrupt_leaves_nothing_on_the_nodes(cluster: SlurmCluster, tmp_path: Path) -> None:
    outcome, left = _case(cluster, tmp_path, "interrupt")
    assert outcome["type"] == "KeyboardInterrupt", outcome
    assert left == []  # gone before the launch raised, while the allocation still runs


def test_a_pool_spreads_over_the_allocation(cluster: SlurmCluster, tmp_path: Path) -> None:
    outcome, left = _case(cluster, tmp_path, "pool")
    assert outcome.get("results") == [[rank, 4.0] for rank in range(4)], outcome
    assert outcome["hosts"] == ["sn0", "sn0", "sn1", "sn1"]
    assert outcome["big"] == [True] * 4  # pushed to the nodes and pulled back
    assert "Raised on rank 3 of 4 (host sn1)" in "\n".join(outcome["failure"])  # type: ignore[arg-type]
    assert left == []


def test_input_on_a_node_is_asked_in_the_kernel(cluster: SlurmCluster, tmp_path: Path) -> None:
    outcome, left = _case(cluster, tmp_path, "prompt")
    assert outcome.get("results") == ["", "", "", "ada"], outcome
    assert outcome["asked"] == ["[rank 3] name? "]
    assert left == []
