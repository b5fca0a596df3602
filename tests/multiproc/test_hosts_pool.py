"""A ``%%distributed`` pool spread over SSH hosts: the ranks keep their namespace across
commands on two machines (network namespaces with real OpenSSH servers); commands, values,
interrupts and questions go through each host's node process; a failure names its host and
the pool lives on; a killed rank stops the pool; nothing is left on the hosts."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from ssh_hosts import SshMachines, require_ssh_machines

from nb_accel.errors import CollectiveTimeoutError, WorkerDiedError
from nb_accel.launch.pool import WorkerPool, load_value
from nb_accel.worker.transfer.segments import SHARE_MIN_BYTES

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def machines(tmp_path: Path, request: pytest.FixtureRequest) -> SshMachines:
    """Two SSH hosts, ``node0`` and ``node1``, in the test's ``ssh_config``."""
    require_ssh_machines()
    return SshMachines(tmp_path, request.addfinalizer)


@pytest.fixture
def pool(machines: SshMachines) -> Iterator[WorkerPool]:
    """A started pool of two ranks on each host."""
    workers = WorkerPool(2, cpu=True, hosts=["node0", "node1"], ssh_config=machines.ssh_config)
    workers.start()
    try:
        yield workers
    finally:
        workers.stop()


def _values(done: dict[int, object]) -> list[object]:
    return [load_value(reply) for _, reply in sorted(done.items())]  # type: ignore[arg-type]


def test_a_pool_keeps_its_namespace_on_every_host(
    pool: WorkerPool, machines: SshMachines, capfd: pytest.CaptureFixture[str]
) -> None:
    assert pool.world_size == 4
    assert "on each of 2 hosts over ssh (node0, node1), 4 ranks" in pool.describe()
    pool.execute(
        "import os, torch, torch.distributed as dist\nnet = os.readlink('/proc/self/ns/net')"
    )
    done = pool.execute(
        "t = torch.tensor([float(rank)])\ndist.all_reduce(t)\nprint('here', flush=True)\n"
        "(rank, world_size, t.item())",
        want_value=True,
        all_output=True,
    )
    assert _values(done) == [(rank, 4, 6.0) for rank in range(4)]
    out = capfd.readouterr().out
    assert "[node0 rank 1] here" in out and "[node1 rank 3] here" in out, out
    machine = _values(pool.execute("net", want_value=True))  # each host: its own network
    assert machine[0] == machine[1] != machine[2] == machine[3]  # two machines, two ranks each
    big = torch.arange(4 * SHARE_MIN_BYTES // 8, dtype=torch.float64)  # aside from the pickle
    pool.push({"big": big})  # to every host, which shares no memory with the kernel
    assert pool.pull("big", ranks=[3])[0].equal(big)
    made = _values(pool.execute("big * (rank + 1)", want_value=True))  # made on the hosts
    assert [value.equal(big * (rank + 1)) for rank, value in enumerate(made)] == [True] * 4
    status = pool.status()
    assert [(s.rank, s.host, s.alive) for s in status] == [
        (0, "node0", True),
        (1, "node0", True),
        (2, "node1", True),
        (3, "node1", True),
    ]
    assert all(s.memory_mb and s.memory_mb > 10 for s in status), status
    stacks = pool.where()
    assert sorted(stacks) == [0, 1, 2, 3] and all(s.idle for s in stacks.values()), stacks
    pool.stop()
    machines.settle()
    assert machines.processes() == []


def test_a_failure_names_its_host_and_the_pool_lives_on(
    pool: WorkerPool, machines: SshMachines
) -> None:
    with pytest.raises(KeyError, match="on rank 3") as info:
        pool.execute(
            "import torch.distributed as dist\n"
            "if rank == 3:\n    raise KeyError('on rank 3')\n"
            "dist.barrier()"  # the others wait here: released when rank 3 failed
        )
    notes = "\n".join(info.value.__notes__)
    assert "rank 3 of 4 (host node1)" in notes, notes
    sums = _values(
        pool.execute(
            "import torch\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()", want_value=True
        )
    )
    assert sums == [4.0] * 4  # the process group was rebuilt across the hosts


def test_ranks_past_the_timeout_on_the_hosts_free_themselves_and_the_pool_lives_on(
    machines: SshMachines,
) -> None:
    """The hosts' ranks keep the pool's collective timeout themselves: collectives that can
    never match (three all_reduce, one recv) end at the timeout, and the pool goes on."""
    hosts = {"hosts": ["node0", "node1"], "ssh_config": machines.ssh_config}
    pool = WorkerPool(2, cpu=True, timeout=2, **hosts)
    pool.start()
    try:
        with pytest.raises(CollectiveTimeoutError, match="timed out after 2 s on rank"):
            pool.execute(
                "import torch, torch.distributed as dist\n"
                "if rank == 3:\n    dist.recv(torch.ones(1), src=0)\n"
                "else:\n    dist.all_reduce(torch.ones(1))"
            )
        sums = _values(
            pool.execute("t = torch.ones(1)\ndist.all_reduce(t)\nt.item()", want_value=True)
        )
        assert sums == [4.0] * 4
    finally:
        pool.stop()
    machines.settle()
    assert machines.processes() == []


def _interrupt_when(marker: Path, ready: threading.Event) -> None:
    while not marker.exists():
        if ready.wait(0.05):
            return
    os.kill(os.getpid(), signal.SIGINT)


def test_an_interrupt_reaches_the_ranks_on_every_host(
    pool: WorkerPool, machines: SshMachines, tmp_path: Path
) -> None:
    marker = tmp_path / "waiting"
    done = threading.Event()
    interrupter = threading.Thread(target=_interrupt_when, args=(marker, done))
    interrupter.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            pool.execute(
                "import threading\nfrom pathlib import Path\n"
                f"if rank == 3:\n    Path({str(marker)!r}).touch()\n"
                "threading.Event().wait(600)"
            )
    finally:
        done.set()
        interrupter.join()
    assert pool.running
    assert _values(pool.execute("rank", want_value=True)) == [0, 1, 2, 3]


def test_a_killed_rank_stops_the_pool_and_names_its_host(
    pool: WorkerPool, machines: SshMachines
) -> None:
    with pytest.raises(WorkerDiedError, match=r"rank 2 \(pid \d+ on node1\) was killed by SIGKILL"):
        pool.execute(
            "import os, signal, torch.distributed as dist\n"
            "if rank == 2:\n    os.kill(os.getpid(), signal.SIGKILL)\n"
            "dist.barrier()"
        )
    assert not pool.running
    machines.settle()
    assert machines.processes() == []


def test_the_magic_spreads_its_pool_over_the_hosts(machines: SshMachines) -> None:
    from jupyter_client.manager import start_new_kernel

    manager, client = start_new_kernel(kernel_name="python3")
    try:
        with contextlib.ExitStack() as stack:
            stack.callback(manager.shutdown_kernel, now=True)
            stack.callback(client.stop_channels)
            _run(client, "%load_ext nb_accel")
            text = _run(
                client,
                f"%%distributed -n 1 --cpu --hosts node0,node1 --ssh-config {machines.ssh_config}"
                " --all-ranks\nimport socket\nprint('on', rank, flush=True)\nworld_size",
            )
            started = "on each of 2 hosts over ssh (node0, node1), 2 ranks for %%distributed"
            assert started in text, text
            assert "[node0 rank 0] on 0" in text and "[node1 rank 1] on 1" in text, text
            assert text.rstrip().endswith("\n2"), text  # the cell's value: world_size
            status = _run(client, "%distributed status")
            assert "node0" in status and "node1" in status, status
            _run(client, "%distributed stop")
    finally:
        machines.settle()
    assert machines.processes() == []


def _run(client: object, code: str) -> str:
    """Run ``code`` in the kernel; its stream and result text (an error fails the test)."""
    reply = client.execute_interactive(code, timeout=240, output_hook=(out := _Collect()))  # type: ignore[attr-defined]
    assert reply["content"]["status"] == "ok", out.text
    return out.text


class _Collect:
    """Collects the text a kernel sends for one execution."""

    def __init__(self) -> None:
        self.text = ""

    def __call__(self, message: dict[str, object]) -> None:
        content = message["content"]
        assert isinstance(content, dict)
        if message["msg_type"] == "stream":
            self.text += str(content["text"])
        elif message["msg_type"] in ("execute_result", "display_data"):
            self.text += str(content["data"].get("text/plain", ""))  # type: ignore[union-attr]
        elif message["msg_type"] == "error":
            self.text += "\n".join(content["traceback"])  # type: ignore[arg-type]


def on_host(step: int) -> tuple[str, int, int, int]:
    """This rank's machine (its network namespace), pid, the step, and launches seen."""
    from nb_accel import resident

    seen = resident("seen", list)
    seen.append(step)
    return os.readlink("/proc/self/ns/net"), os.getpid(), step, len(seen)


def test_warm_launches_over_the_hosts_run_on_the_same_workers(machines: SshMachines) -> None:
    import nb_accel
    from nb_accel import notebook_launcher

    options = {
        "num_processes": 2,
        "cpu": True,
        "hosts": ["node0", "node1"],
        "ssh_config": machines.ssh_config,
        "reuse_workers": True,
    }
    try:
        first = notebook_launcher(on_host, args=(1,), **options)
        second = notebook_launcher(on_host, args=(2,), **options)
    finally:
        nb_accel.stop_workers()
    assert [r[:2] for r in first] == [r[:2] for r in second]  # the same processes
    assert len({r[0] for r in first}) == 2  # two machines, two ranks each
    assert [r[2:] for r in second] == [(2, 2)] * 4
