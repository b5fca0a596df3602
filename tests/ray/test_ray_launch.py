"""Launches on a real Ray cluster (``hosts="ray"``): Ray's own ``ray start`` on two machines
(``ray_cluster.py``), the kernel on the head node, as a notebook there runs. Results in rank
order from both nodes, big values through the launch's own channel (not Ray's object store),
a failure and a killed rank named with their node, ``num_nodes``, a restart after a death, an
interrupt, warm workers kept on the cluster, a ``%%distributed`` cell in a real kernel; after
each, the placement group is removed and nothing of the launch is left on either node, nor
after the kernel dies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
from markers import wait_for_files
from own_folders import own_folders_command
from ray_cluster import RayCluster

pytestmark = pytest.mark.timeout(240)

#: What every kernel script starts with: its functions are the notebook's, the launch's
#: outcome printed as one JSON line, and a pause where the test looks at the nodes.
PRELUDE = """
import json, os, signal, socket, sys, threading, time
from pathlib import Path
import torch
import torch.distributed as dist
from nb_accel import notebook_launcher

def say(**outcome):
    print("OUTCOME", json.dumps(outcome), flush=True)

def placement_groups():  # the cluster's groups not removed (the table keeps removed ones)
    import ray
    states = (group["state"] for group in ray.util.placement_group_table().values())
    return sorted(state for state in states if state != "REMOVED")

def pause():  # the test looks at the nodes, then answers
    print("PAUSED", flush=True)
    sys.stdin.readline()
"""


def _script(cluster: RayCluster, name: str, body: str) -> Path:
    script = cluster.kernels / f"{name}.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    return script


def _outcome(stdout: str) -> dict[str, object]:
    lines = [line for line in stdout.splitlines() if line.startswith("OUTCOME ")]
    assert lines, stdout
    return json.loads(lines[-1].removeprefix("OUTCOME "))  # type: ignore[no-any-return]


def _run_kernel(
    cluster: RayCluster, name: str, body: str, look: bool = False
) -> tuple[dict[str, object], str]:
    """Run ``body`` as a kernel on the head node: its outcome and all it printed; with
    ``look``, the nodes are checked for leftovers while it pauses (its Ray connection open)."""
    script = _script(cluster, name, body)
    kernel = subprocess.Popen(
        cluster.on_head([sys.executable, str(script)]),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert kernel.stdout is not None and kernel.stdin is not None
        if look:
            said = ""
            for line in kernel.stdout:
                said += line
                if line.startswith("PAUSED"):
                    break
            cluster.settle(30)  # Ray ends a killed actor's process just after the call
            left = cluster.processes()
            assert left == [], "\n".join(left) + said  # the actors gone, the driver still on
            kernel.stdin.write("go on\n")
            kernel.stdin.flush()
            rest, errors = kernel.communicate(timeout=120)
            stdout = said + rest
        else:
            stdout, errors = kernel.communicate(timeout=180)
    finally:
        if kernel.poll() is None:
            kernel.kill()
            kernel.communicate()
    assert kernel.returncode == 0, stdout + errors
    return _outcome(stdout), stdout + errors


def test_ranks_on_both_nodes_return_in_rank_order_and_nothing_stays(
    ray_cluster: RayCluster,
) -> None:
    outcome, shown = _run_kernel(
        ray_cluster,
        "both_nodes",
        """
        def work(big):
            value = torch.ones(1) * (dist.get_rank() + 1)
            dist.all_reduce(value)
            print("summed", flush=True)
            return dist.get_rank(), socket.gethostname(), value.item(), big * (dist.get_rank() + 1)

        # above Ray's 100 MB limit for a task's arguments: it travels on the launch's channel
        big = torch.arange(30_000_000, dtype=torch.float32)
        results = notebook_launcher(work, (big,), num_processes=2, hosts="ray")
        say(
            results=[[r, host, v, scaled.equal(big * (r + 1))] for r, host, v, scaled in results],
            groups=placement_groups(),
        )
        pause()
        """,
        look=True,
    )
    assert outcome["results"] == [
        [0, "rayhead", 10.0, True],
        [1, "rayhead", 10.0, True],
        [2, "raynode1", 10.0, True],
        [3, "raynode1", 10.0, True],
    ]
    assert outcome["groups"] == []
    head, node = ray_cluster.head.address, ray_cluster.node.address
    assert f"on each of 2 hosts over ray ({head}, {node}), 4 ranks" in shown, shown
    assert f"[{node} rank 3] summed" in shown, shown


def test_a_kernel_connected_by_a_ray_client_address_launches_on_the_cluster(
    ray_cluster: RayCluster,
) -> None:
    """A notebook connected with a ``ray://`` address (Ray Client, the head's port 10001, as
    from a laptop): the launch uses that connection, its ranks on both nodes, and a failure
    comes back as with ``address="auto"``."""
    outcome, _ = _run_kernel(
        ray_cluster,
        "ray_client",
        f"""
        import ray

        for attempt in range(3):  # Ray's own client server may be slow to start for it
            try:
                ray.init("ray://{ray_cluster.head.address}:10001", logging_level="ERROR")
                break
            except ConnectionAbortedError as error:
                if attempt == 2 or "Starting Ray client server failed" not in str(error):
                    raise
        assert ray.util.client.ray.is_connected()

        def work(fail):
            value = torch.ones(1)
            dist.all_reduce(value)
            if fail and dist.get_rank() == 3:
                raise KeyError("only on rank 3")
            return dist.get_rank(), socket.gethostname(), value.item()

        results = notebook_launcher(work, (False,), num_processes=2, hosts="ray")
        try:
            notebook_launcher(work, (True,), num_processes=2, hosts="ray")
        except KeyError as error:
            failed = [str(error), *error.__notes__]
        say(results=results, failed=failed, groups=placement_groups())
        ray.shutdown()
        """,
    )
    assert outcome["results"] == [
        [0, "rayhead", 4.0],
        [1, "rayhead", 4.0],
        [2, "raynode1", 4.0],
        [3, "raynode1", 4.0],
    ]
    failed = "\n".join(outcome["failed"])  # type: ignore[arg-type]
    assert f"Raised on rank 3 of 4 (host {ray_cluster.node.address})" in failed, failed
    assert outcome["groups"] == []
    ray_cluster.settle(30)  # Ray ends the actors' processes just after
    assert ray_cluster.processes() == []


def test_an_exception_comes_back_with_its_type_rank_and_node(ray_cluster: RayCluster) -> None:
    outcome, _ = _run_kernel(
        ray_cluster,
        "raises",
        """
        def fails_on_rank_three():
            dist.barrier()
            if dist.get_rank() == 3:
                raise KeyError("only on rank 3")
            dist.barrier()

        try:
            notebook_launcher(fails_on_rank_three, num_processes=2, hosts="ray", timeout=600)
        except KeyError as error:
            say(error=str(error), notes=error.__notes__, groups=placement_groups())
        """,
    )
    assert outcome["error"] == "'only on rank 3'"
    notes = "\n".join(outcome["notes"])  # type: ignore[arg-type]
    assert f"Raised on rank 3 of 4 (host {ray_cluster.node.address})" in notes, notes
    assert outcome["groups"] == []
    ray_cluster.settle(30)  # Ray ends the actors' processes just after
    assert ray_cluster.processes() == []


def test_a_killed_rank_is_named_with_its_node_and_a_restart_resumes(
    ray_cluster: RayCluster,
) -> None:
    outcome, _ = _run_kernel(
        ray_cluster,
        "killed",
        """
        from nb_accel.errors import WorkerDiedError

        def killed_on_rank_two(always):
            if dist.get_rank() == 2 and (always or os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"):
                os.kill(os.getpid(), signal.SIGKILL)
            dist.barrier()
            return dist.get_rank(), os.environ["TORCHELASTIC_RESTART_COUNT"]

        try:
            notebook_launcher(killed_on_rank_two, (True,), num_processes=2, hosts="ray")
        except WorkerDiedError as error:
            died = str(error)
        restarted = notebook_launcher(
            killed_on_rank_two, (False,), num_processes=2, hosts="ray", max_restarts=1
        )
        say(died=died, restarted=restarted, groups=placement_groups())
        """,
    )
    node = ray_cluster.node.address
    assert "rank 2 (pid" in str(outcome["died"]) and f"on {node}) was killed by SIGKILL" in str(
        outcome["died"]
    ), outcome
    assert outcome["restarted"] == [[rank, "1"] for rank in range(4)]
    assert outcome["groups"] == []
    ray_cluster.settle(30)  # Ray ends the actors' processes just after
    assert ray_cluster.processes() == []


def test_num_nodes_takes_fewer_nodes_and_too_many_is_refused_before_anything_starts(
    ray_cluster: RayCluster,
) -> None:
    outcome, _ = _run_kernel(
        ray_cluster,
        "num_nodes",
        """
        where = notebook_launcher(socket.gethostname, num_processes=2, hosts="ray", num_nodes=1)
        try:
            notebook_launcher(socket.gethostname, num_processes=2, hosts="ray", num_nodes=3)
        except ValueError as error:
            refused = str(error)
        try:
            notebook_launcher(socket.gethostname, num_processes=3, hosts="ray")
        except ValueError as error:
            too_big = str(error)
        say(where=where, refused=refused, too_big=too_big, groups=placement_groups())
        """,
    )
    assert outcome["where"] == ["rayhead", "rayhead"]  # the kernel's node first
    head, node = ray_cluster.head.address, ray_cluster.node.address
    assert "needs 3 nodes with 2 CPUs each" in str(outcome["refused"]), outcome
    assert f"{head} (2 CPUs), {node} (2 CPUs)" in str(outcome["refused"]), outcome
    assert "needs a node with 3 CPUs each" in str(outcome["too_big"]), outcome
    assert "0 of the cluster's nodes have that many" in str(outcome["too_big"]), outcome
    assert outcome["groups"] == []  # the refused launches made none


#: A launch whose four ranks (two on each node) say they run, then wait; ``{caught}``: what
#: the kernel does with the launch's end.
WAITING_LAUNCH = """
from nb_accel.errors import LaunchError

def waits(folder):
    Path(folder, f"rank{{dist.get_rank()}}").touch()
    threading.Event().wait(600)

try:
    notebook_launcher(waits, ({folder!r},), num_processes=2, hosts="ray")
{caught}
"""


@contextmanager
def _ranks_waiting(cluster: RayCluster, name: str, caught: str) -> Iterator[subprocess.Popen[str]]:
    """A kernel on the head node whose launch's four ranks all run (and wait), while the block
    runs; ended at its end if it still runs."""
    folder = cluster.kernels / f"marks-{name}"
    folder.mkdir()
    script = _script(cluster, name, WAITING_LAUNCH.format(folder=str(folder), caught=caught))
    kernel = subprocess.Popen(
        cluster.on_head([sys.executable, str(script)]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_files(*(folder / f"rank{rank}" for rank in range(4)), timeout_s=120)
        yield kernel
    finally:
        if kernel.poll() is None:
            kernel.kill()
            kernel.communicate()


def _kernel_python(kernel: subprocess.Popen[str]) -> psutil.Process:
    """The kernel's interpreter (``nsenter`` runs it as its child, in the head's namespaces)."""
    for process in psutil.Process(kernel.pid).children(recursive=True):
        if "python" in process.name():
            return process
    raise AssertionError("the kernel's interpreter did not start")


@pytest.mark.parametrize("end", ["interrupt", "kernel killed"])
def test_an_interrupt_or_the_kernel_s_death_leaves_nothing_on_the_nodes(
    ray_cluster: RayCluster, end: str
) -> None:
    caught = "except KeyboardInterrupt:\n    say(interrupted=True, groups=placement_groups())"
    with _ranks_waiting(ray_cluster, f"stopped-{end.replace(' ', '-')}", caught) as kernel:
        python = _kernel_python(kernel)
        if end == "interrupt":
            python.send_signal(signal.SIGINT)
            stdout, errors = kernel.communicate(timeout=60)
            outcome = _outcome(stdout)
            assert outcome == {"interrupted": True, "groups": []}, errors
        else:
            python.kill()
            kernel.communicate(timeout=60)
        ray_cluster.settle(30)
        assert ray_cluster.processes() == []


def test_warm_workers_stay_on_the_cluster_between_launches(ray_cluster: RayCluster) -> None:
    outcome, _ = _run_kernel(
        ray_cluster,
        "warm",
        """
        from nb_accel import LaunchError, stop_workers

        def who():
            return os.getpid(), socket.gethostname()

        first = notebook_launcher(who, num_processes=2, hosts="ray", reuse_workers=True)
        second = notebook_launcher(who, num_processes=2, hosts="ray", reuse_workers=True)
        kept = placement_groups()
        try:  # the warm workers hold every CPU: a cold launch cannot have them
            notebook_launcher(who, num_processes=2, hosts="ray")
        except LaunchError as error:
            held = str(error)
        stop_workers()
        say(first=first, second=second, kept=kept, held=held, groups=placement_groups())
        pause()
        """,
        look=True,
    )
    assert outcome["first"] == outcome["second"]
    assert [host for _, host in outcome["first"]] == ["rayhead"] * 2 + ["raynode1"] * 2  # type: ignore[union-attr]
    assert outcome["kept"] == ["CREATED"]
    head = ray_cluster.head.address
    assert f"node {head} has 2 CPUs and this kernel holds 2 of them already" in str(
        outcome["held"]
    ), outcome
    assert "nb_accel.stop_workers()" in str(outcome["held"])
    assert outcome["groups"] == []


def test_a_node_actor_that_dies_names_its_node_and_stops_the_launch(
    ray_cluster: RayCluster,
) -> None:
    caught = "except LaunchError as error:\n    say(error=str(error), groups=placement_groups())"
    with _ranks_waiting(ray_cluster, "actor-dies", caught) as kernel:
        actors = ray_cluster.pids(ray_cluster.node, "ray::NodeHolder")
        assert len(actors) == 1, ray_cluster.processes()
        psutil.Process(actors[0]).kill()  # as Ray's own end of an actor, or its node's
        stdout, _ = kernel.communicate(timeout=60)
    outcome = _outcome(stdout)
    node = ray_cluster.node.address
    error = str(outcome["error"])
    assert f"the connection to host {node} ended while its workers (ranks 2, 3) ran" in error
    assert "its Ray actor died" in error, error
    assert outcome["groups"] == []
    ray_cluster.settle(30)
    assert ray_cluster.processes() == []


def test_a_breakpoint_asks_in_the_kernel_and_a_late_rank_is_named_where_it_was(
    ray_cluster: RayCluster,
) -> None:
    script = _script(
        ray_cluster,
        "debugged",
        """
        from nb_accel.errors import CollectiveTimeoutError

        def stops_at_a_breakpoint():
            hidden = 21.0 + dist.get_rank() - 2
            if dist.get_rank() == 2:
                breakpoint()
            value = torch.ones(1) * (dist.get_rank() + 1)
            dist.all_reduce(value)
            return value.item()

        def late_on_rank_three():
            if dist.get_rank() == 3:
                time.sleep(600)  # its own code: only the launch's stop ends it
            dist.all_reduce(torch.ones(1))

        results = notebook_launcher(stops_at_a_breakpoint, num_processes=2, hosts="ray", timeout=5)
        try:
            notebook_launcher(late_on_rank_three, num_processes=2, hosts="ray", timeout=3)
        except CollectiveTimeoutError as error:
            late = str(error)
        say(results=results, late=late, groups=placement_groups())
        """,
    )
    done = subprocess.run(
        ray_cluster.on_head([sys.executable, str(script)]),
        input="p hidden\nc\n",
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    outcome = _outcome(done.stdout)
    assert outcome["results"] == [10.0] * 4
    assert "(Pdb rank 2) " in done.stdout + done.stderr, done.stdout
    assert f"[{ray_cluster.node.address} rank 2] 21.0" in done.stdout, done.stdout
    late = str(outcome["late"])
    assert "Rank 3 did not arrive (was still running, at `late_on_rank_three` (" in late, late
    assert "debugged.py, line " in late, late
    assert outcome["groups"] == []
    ray_cluster.settle(30)  # Ray ends the actors' processes just after
    assert ray_cluster.processes() == []


NO_CLUSTER = """
from nb_accel import notebook_launcher
try:
    notebook_launcher(print, num_processes=1, hosts="ray")
except ValueError as error:
    print("REFUSED", error)
"""


@pytest.mark.parametrize("address", [None, "127.0.0.1:9"])
def test_a_kernel_that_reaches_no_cluster_is_told_what_to_do(address: str | None) -> None:
    """A kernel on a machine of its own, with no cluster: its own PID namespace (Ray's
    ``address="auto"`` looks for a cluster's processes too, and would find the session's) and
    its own ``/tmp`` (no ``/tmp/ray``); nothing listens on port 9."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "TMPDIR")}
    if address is not None:
        env["RAY_ADDRESS"] = address
    alone = [
        *("unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--mount"),
        *("--propagation", "private", "--"),
    ]
    done = subprocess.run(
        [*alone, *own_folders_command([], [sys.executable, "-c", NO_CLUSTER])],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd="/",
        env=env,
    )
    said = done.stdout + done.stderr
    if address is None:
        assert "REFUSED hosts=\"ray\" found no Ray cluster at address='auto'" in said, said
        assert "ray start --head" in said, said
    else:
        assert f"REFUSED hosts=\"ray\" found no Ray cluster at RAY_ADDRESS='{address}'" in said
