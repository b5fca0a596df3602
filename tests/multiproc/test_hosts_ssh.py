"""Launches across SSH hosts driven from the kernel: two machines (network namespaces with real
OpenSSH servers), a node process on each started over ``ssh``, results in rank order, output
prefixed with host and rank, failures naming their host, versions checked first, an unreachable
host named; after an interrupt or the kernel's death nothing is left on the hosts."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist
from markers import when_marked
from own_folders import OWN_FOLDERS
from ssh_hosts import SshMachines, require_ssh_machines

from nb_accel import Config, notebook_launcher, save_config
from nb_accel.errors import CollectiveTimeoutError, LaunchError, WorkerDiedError
from nb_accel.worker.transfer.segments import SHARE_MIN_BYTES

pytestmark = pytest.mark.timeout(240)

#: A collective timeout short enough to be held past at a prompt.
TIMEOUT_S = 2


@pytest.fixture
def machines(tmp_path: Path, request: pytest.FixtureRequest) -> SshMachines:
    """Two SSH hosts, ``node0`` and ``node1``, in the test's ``ssh_config``."""
    require_ssh_machines()
    return SshMachines(tmp_path, request.addfinalizer)


def sum_of_ranks(offset: int) -> tuple[int, int, float]:
    print("summing", flush=True)
    value = torch.tensor([float(dist.get_rank() + offset)])
    dist.all_reduce(value)
    return dist.get_rank(), dist.get_world_size(), value.item()


def test_two_hosts_train_together_and_return_every_rank_s_result(
    machines: SshMachines, capfd: pytest.CaptureFixture[str]
) -> None:
    results = notebook_launcher(
        sum_of_ranks,
        (1,),
        num_processes=2,
        cpu=True,
        hosts=["node0", "node1"],
        ssh_config=machines.ssh_config,
    )
    assert results == [(rank, 4, 10.0) for rank in range(4)]  # 1 + 2 + 3 + 4
    title = "Launching 2 processes on CPU (gloo; fork) on each of 2 hosts over ssh (node0, node1)"
    out = capfd.readouterr().out
    assert f"{title}, 4 ranks" in out
    assert "[node0 rank 1] summing" in out and "[node1 rank 2] summing" in out, out
    assert machines.processes() == []  # the node processes and their workers have ended


def scaled_with_the_host_s_folders(big: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    import os

    return big * (dist.get_rank() + 1), [os.stat(folder).st_dev for folder in OWN_FOLDERS]


def test_big_values_travel_to_the_hosts_and_back(machines: SshMachines) -> None:
    """A tensor above the shared-memory threshold goes to every host as an argument and comes
    back as a result; the hosts share no ``/dev/shm`` or temporary folder with the kernel or
    each other, as real machines do not."""
    big = torch.arange(2 * SHARE_MIN_BYTES // 8, dtype=torch.float64)
    results = notebook_launcher(
        scaled_with_the_host_s_folders,
        (big,),
        num_processes=1,
        cpu=True,
        hosts=["node0", "node1"],
        ssh_config=machines.ssh_config,
    )
    assert [value.equal(big * (rank + 1)) for rank, (value, _) in enumerate(results)] == [
        True,
        True,
    ]
    kernel = [os.stat(folder).st_dev for folder in OWN_FOLDERS]
    (_, node0), (_, node1) = results
    for index in range(len(OWN_FOLDERS)):
        assert len({kernel[index], node0[index], node1[index]}) == 3, (kernel, node0, node1)
    assert machines.processes() == []


def fails_on_rank_three() -> str:
    if dist.get_rank() == 3:
        raise KeyError("only on rank 3")
    dist.barrier()
    return socket.gethostname()


def test_an_exception_comes_back_with_its_type_rank_and_host(
    machines: SshMachines, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(KeyError, match="only on rank 3") as info:
        notebook_launcher(
            fails_on_rank_three,
            num_processes=2,
            cpu=True,
            hosts=["node0", "node1"],
            ssh_config=machines.ssh_config,
            timeout=600,  # the barrier must not time out: the others are released
        )
    notes = "\n".join(info.value.__notes__)
    assert "Raised on rank 3 of 4 (host node1)" in notes, notes
    # the text view: the ranks the launch stopped are shown stopped, and never failing after
    shown = capsys.readouterr().err
    assert re.findall(r"^rank (\d+) \(node\d\) failed", shown, re.MULTILINE) == ["3"], shown
    assert machines.processes() == []


def late_on_rank_three() -> None:
    if dist.get_rank() == 3:
        time.sleep(600)  # its own code: only the launch's stop ends it
    dist.all_reduce(torch.ones(1))


def test_a_late_rank_on_a_host_is_named_where_it_was(machines: SshMachines) -> None:
    """Rank 3 is still in its own code when the others time out: its host is asked where it
    is before it is stopped; the launch ends at the timeout."""
    with pytest.raises(CollectiveTimeoutError) as info:
        notebook_launcher(
            late_on_rank_three,
            num_processes=2,
            cpu=True,
            hosts=["node0", "node1"],
            ssh_config=machines.ssh_config,
            timeout=3,
        )
    message = str(info.value)
    assert "Rank 3 did not arrive (was still running, at `late_on_rank_three` (" in message
    sleep_line = late_on_rank_three.__code__.co_firstlineno + 2
    assert f"test_hosts_ssh.py, line {sleep_line})" in message, message
    assert machines.processes() == []


def killed_on_rank_two() -> None:
    import os
    import signal

    if dist.get_rank() == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()


def test_a_killed_remote_worker_names_its_rank_and_host(machines: SshMachines) -> None:
    with pytest.raises(WorkerDiedError, match=r"rank 2 \(pid \d+ on node1\) was killed by SIGKILL"):
        notebook_launcher(
            killed_on_rank_two,
            num_processes=2,
            cpu=True,
            hosts=["node0", "node1"],
            ssh_config=machines.ssh_config,
        )
    assert machines.processes() == []


def killed_on_rank_two_at_first() -> tuple[int, str]:
    if dist.get_rank() == 2 and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()
    return dist.get_rank(), os.environ["TORCHELASTIC_RESTART_COUNT"]


def test_a_killed_remote_worker_restarts_every_host_s_workers(
    machines: SshMachines, capfd: pytest.CaptureFixture[str]
) -> None:
    results = notebook_launcher(
        killed_on_rank_two_at_first,
        num_processes=2,
        cpu=True,
        hosts=["node0", "node1"],
        ssh_config=machines.ssh_config,
        max_restarts=1,
    )
    assert results == [(rank, "1") for rank in range(4)]  # every rank of the second attempt
    err = capfd.readouterr().err
    assert re.search(r"restart 1 of 1 after rank 2 was killed by SIGKILL", err), err
    assert machines.processes() == []


def open_a_run_each_then_die_on_rank_2(uri: str) -> None:
    """Every rank opens an MLflow run of its own (in the store at ``uri``); once all are open,
    rank 2 (on node1) dies at once (SIGKILL: its run stays open)."""
    os.environ["MLFLOW_TRACKING_URI"] = uri
    from nb_accel import Accelerator
    from nb_accel.tracking import MLflowTracker

    class RunPerRank(MLflowTracker):
        main_process_only = False

    accelerator = Accelerator(log_with=[RunPerRank("killed")])
    accelerator.init_trackers("killed", config={"rank": accelerator.process_index})
    accelerator.wait_for_everyone()
    if accelerator.process_index == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    accelerator.wait_for_everyone()


def test_a_killed_remote_worker_s_run_is_ended_on_its_host(
    machines: SshMachines, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The run's store could be on node1 only: node1's node process ends the run of its
    killed worker, and the kernel says so. The other ranks end theirs as failed on their way
    out, or, where the launch's stop overtook them (a second's grace, on a loaded machine),
    as killed: no run is left running."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(tracking_uri=uri).create_experiment("killed")  # not made by 4 at once
    with pytest.raises(WorkerDiedError, match=r"rank 2 \(pid \d+ on node1\)"):
        notebook_launcher(
            open_a_run_each_then_die_on_rank_2,
            (uri,),
            num_processes=2,
            cpu=True,
            hosts=["node0", "node1"],
            ssh_config=machines.ssh_config,
        )
    runs = MlflowClient(tracking_uri=uri).search_runs(
        [MlflowClient(tracking_uri=uri).get_experiment_by_name("killed").experiment_id]
    )
    statuses = {run.data.params["rank"]: run.info.status for run in runs}
    assert sorted(statuses) == ["0", "1", "2", "3"] and statuses["2"] == "KILLED", statuses
    assert {statuses[rank] for rank in "013"} <= {"FAILED", "KILLED"}, statuses
    said = capfd.readouterr().err
    assert "rank 2 was stopped before it ended its mlflow run" in said, said
    assert "ended as killed (on host node1)" in said, said
    assert machines.processes() == []


def test_an_unreachable_host_is_named_and_nothing_stays_on_the_others(
    machines: SshMachines,
) -> None:
    config = machines.ssh_config
    nobody = machines.kernel_address.rsplit(".", 1)[0] + ".77"  # no machine has it
    config.write_text(
        config.read_text() + f"Host nowhere\n  HostName {nobody}\n  ConnectTimeout 2\n"
    )
    with pytest.raises(LaunchError, match="host nowhere could not be reached over ssh"):
        notebook_launcher(
            sum_of_ranks,
            (0,),
            num_processes=1,
            cpu=True,
            hosts=["node0", "nowhere"],
            ssh_config=config,
        )
    assert machines.processes() == []


def test_a_host_with_other_versions_is_refused_before_anything_starts(
    machines: SshMachines, tmp_path: Path
) -> None:
    other = tmp_path / "other-python"  # the kernel's interpreter, with another torch version
    other.write_text(
        "#!/bin/sh\n"
        f"exec {sys.executable} -c \"import torch; torch.__version__ = '2.0.0'; import runpy; "
        "runpy.run_module('nb_accel.launch.hosts.remote_node', run_name='__main__')\"\n"
    )
    other.chmod(0o755)
    with pytest.raises(LaunchError) as info:
        notebook_launcher(
            sum_of_ranks,
            (0,),
            num_processes=1,
            cpu=True,
            hosts=["node0", "node1"],
            ssh_config=machines.ssh_config,
            remote_python=str(other),
        )
    message = str(info.value)
    assert (
        f"host node0 ({sys.executable}): torch 2.0.0 (the kernel has {torch.__version__})"
        in message
    )
    assert "host node1" in message and "nothing was started" in message
    assert machines.processes() == []


def waits_for_ever(folder: str) -> None:
    Path(folder, f"rank{dist.get_rank()}").touch()  # every machine reaches the test's folder
    threading.Event().wait(600)


def _launch_waiting(
    machines: SshMachines, folder: Path, function: Callable[[str], None] = waits_for_ever
) -> None:
    """Two ranks on each host, running ``function`` (waiting for ever once they marked
    ``folder``)."""
    notebook_launcher(
        function,
        (str(folder),),
        num_processes=2,
        cpu=True,
        hosts=["node0", "node1"],
        ssh_config=machines.ssh_config,
    )


def _listening(machines: SshMachines) -> dict[str, list[str]]:
    """Each host's listening TCP sockets (``address:port``), its ``sshd``'s left out."""
    found: dict[str, list[str]] = {}
    for host in machines.hosts:
        done = subprocess.run(
            ["ip", "netns", "exec", host.namespace, "ss", "-Hltn"],
            capture_output=True,
            text=True,
            check=True,
        )
        local = [line.split()[3] for line in done.stdout.splitlines() if line.strip()]
        found[host.name] = [a for a in local if not a.endswith(":22")]
    return found


def test_an_interrupt_stops_every_host_s_workers(machines: SshMachines, tmp_path: Path) -> None:
    listening: dict[str, list[str]] = {}

    def look_then_interrupt() -> None:
        listening.update(_listening(machines))
        os.kill(os.getpid(), signal.SIGINT)

    with (
        when_marked(tmp_path, 4, look_then_interrupt),
        pytest.raises(KeyboardInterrupt),
    ):
        _launch_waiting(machines, tmp_path)
    assert machines.processes() == []
    # The rendezvous (host 0) and the backends' sockets listen on the hosts' network only
    assert listening["node0"], listening  # the rendezvous store, at least
    for host in machines.hosts:
        assert all(a.rsplit(":", 1)[0] == host.address for a in listening[host.name]), listening


def waits_deaf_to_the_stack_signal(folder: str) -> None:
    """Rank 3 ignores the signal that asks a rank where it is (a library of its own took it)."""
    from nb_accel.worker.reporting.stacks import STACK_SIGNAL

    if dist.get_rank() == 3:
        signal.signal(STACK_SIGNAL, signal.SIG_IGN)
    waits_for_ever(folder)


def test_an_interrupt_does_not_wait_for_a_rank_that_cannot_say_where_it_is(
    machines: SshMachines, tmp_path: Path
) -> None:
    """An interrupt ends within its bound of 2 s (the chaos campaign's): a host asks its ranks
    where they are for a bounded time, and the kernel waits for its answer no longer. Here
    0.7 s; before, 2.2 s (a rank that did not answer was asked twice, for a second each
    time), and up to 6 s for a host that did not answer."""
    interrupted: list[float] = []

    def interrupt() -> None:
        interrupted.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    with (
        when_marked(tmp_path, 4, interrupt),
        pytest.raises(KeyboardInterrupt) as info,
    ):
        _launch_waiting(machines, tmp_path, waits_deaf_to_the_stack_signal)
    took = time.monotonic() - interrupted[0]
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "rank 3 did not say where it was within 0.6 s" in notes, notes
    assert "rank 0 was" in notes and "rank 2 was" in notes, notes
    assert took < 2.0, f"{took:.1f} s from the interrupt to its raise"
    assert machines.processes() == []


#: A kernel of its own, killed while its launch runs.
KERNEL = """
import sys, threading
from pathlib import Path
from nb_accel import notebook_launcher

def waits_for_ever(folder):
    import torch.distributed as dist
    Path(folder, f"rank{dist.get_rank()}").touch()
    threading.Event().wait(600)

notebook_launcher(
    waits_for_ever, (sys.argv[1],), num_processes=1, cpu=True, hosts=["node0", "node1"],
    ssh_config=sys.argv[2],
)
"""


def test_a_kernel_that_dies_leaves_nothing_on_the_hosts(
    machines: SshMachines, tmp_path: Path
) -> None:
    script = tmp_path / "kernel.py"
    script.write_text(KERNEL)
    kernel = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path), str(machines.ssh_config)]
    )
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"rank{r}").exists() for r in (0, 1)):
            assert kernel.poll() is None and time.monotonic() < deadline, "the launch did not start"
            time.sleep(0.05)
    finally:
        kernel.kill()
        kernel.wait()
    machines.settle()  # the channels close; each host stops its agent
    assert machines.processes() == []


def test_saved_hosts_are_the_launch_s_default(
    machines: SshMachines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NB_ACCEL_CONFIG_FILE", str(tmp_path / "config.yaml"))
    save_config(Config(hosts=["node0", "node1"], ssh_config=str(machines.ssh_config)))
    assert notebook_launcher(sum_of_ranks, (1,), num_processes=1, cpu=True) == [
        (0, 2, 3.0),
        (1, 2, 3.0),
    ]
    assert machines.processes() == []


def test_the_several_machines_notebook_runs_on_the_hosts(
    machines: SshMachines, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import nbformat
    from nbclient import NotebookClient

    notebook_path = Path(__file__).parents[2] / "notebooks" / "several_machines.ipynb"
    notebook = nbformat.read(notebook_path, as_version=4)
    assert all(not cell.get("outputs") for cell in notebook.cells), "saved with outputs"
    monkeypatch.setenv("DEMO_HOSTS", "node0,node1")
    monkeypatch.setenv("DEMO_SSH_CONFIG", str(machines.ssh_config))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    NotebookClient(notebook, timeout=300, kernel_name="python3").execute()
    text = "".join(
        output.get("text", "") for cell in notebook.cells for output in cell.get("outputs", [])
    )
    assert "rank 3 on " in text and "[node1 rank 3] rank 3 done, loss" in text, text
    assert "ValueError the last rank found a bad batch" in text
    assert "Raised on rank 3 of 4 (host node1)" in text
    assert "[node1 rank 1] rank 1 of 2 still has total = 3.0" in text, text  # %%distributed
    assert machines.processes() == []


def _drop_node1() -> None:
    """Kill the kernel's ``ssh`` to node1: a dropped connection (the machines' ``sshd`` and
    their sessions, ending meanwhile, are this process's descendants too)."""
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.name() == "ssh" and "node1" in child.cmdline():
                child.kill()


def test_a_dropped_connection_names_its_host_and_stops_the_others(
    machines: SshMachines, tmp_path: Path
) -> None:
    with (
        when_marked(tmp_path, 4, _drop_node1),
        pytest.raises(LaunchError, match="the connection to host node1 ended"),
    ):
        _launch_waiting(machines, tmp_path)
    machines.settle()  # node1's node process sees its channel end
    assert machines.processes() == []


def stops_at_a_breakpoint() -> float:
    total = torch.ones(1) * (dist.get_rank() + 1)
    if dist.get_rank() == 2:
        hidden = total.item() * 7  # noqa: F841 - read in the debugger
        breakpoint()
    dist.all_reduce(total)
    return total.item()


def late_on_node1() -> None:
    if dist.get_rank() == 3:
        time.sleep(30)
    dist.barrier()


def test_a_breakpoint_on_a_host_asks_in_the_kernel(
    machines: SshMachines, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """A rank on another machine stops at ``breakpoint()``; its prompt is asked where the
    kernel asks (here the terminal's ``input``), the answers travel back through its host's
    node, and the launch goes on to the right result. The first prompt is held for twice the
    launch's collective timeout: the hosts' ranks leave time at the kernel's prompts out of it,
    and still time out where nobody is at a prompt."""
    asked: list[str] = []
    answers = ["p hidden", "c"]

    def typed(prompt: str = "") -> str:
        asked.append(prompt)
        if len(asked) == 1:
            time.sleep(2 * TIMEOUT_S)  # the user reads the code: the other ranks wait
        return answers.pop(0) if answers else "c"

    monkeypatch.setattr("builtins.input", typed)
    hosts = {"hosts": ["node0", "node1"], "ssh_config": machines.ssh_config}
    results = notebook_launcher(
        stops_at_a_breakpoint, num_processes=2, cpu=True, timeout=TIMEOUT_S, **hosts
    )
    assert results == [10.0] * 4
    assert asked == ["(Pdb rank 2) "] * 2
    out = capfd.readouterr().out
    assert "[node1 rank 2] 21.0" in out, out
    assert machines.processes() == []
    with pytest.raises(CollectiveTimeoutError, match="timed out after 2 s on ranks 0-2 "):
        notebook_launcher(late_on_node1, num_processes=2, cpu=True, timeout=TIMEOUT_S, **hosts)
    machines.settle()
    assert machines.processes() == []


def frozen_on_rank_three() -> None:
    import os
    import signal

    if dist.get_rank() == 3:
        os.kill(os.getpid(), signal.SIGSTOP)
    dist.all_reduce(torch.ones(1))


def test_a_frozen_rank_on_a_host_is_said_to_be_frozen(machines: SshMachines) -> None:
    """Rank 3 is stopped (SIGSTOP) on node1: its host looks at it, and the timeout says it was
    frozen (not still running, which is all the kernel saw before); the stop ends it."""
    with pytest.raises(CollectiveTimeoutError) as info:
        notebook_launcher(
            frozen_on_rank_three,
            num_processes=2,
            cpu=True,
            hosts=["node0", "node1"],
            ssh_config=machines.ssh_config,
            timeout=TIMEOUT_S,
        )
    assert "Rank 3 did not arrive (was frozen: its process was stopped" in str(info.value)
    assert machines.processes() == []


def cut_off_on_rank_three(folder: str) -> None:
    if dist.get_rank() == 3:  # goes on once its host is cut off: its collective is lost
        Path(folder, "rank0").touch()
        while not Path(folder, "cut").exists():
            time.sleep(0.01)
    dist.all_reduce(torch.ones(1))


def test_a_host_cut_off_the_network_is_named_out_of_reach(
    machines: SshMachines, tmp_path: Path
) -> None:
    """node1's link goes down (a pulled cable: nobody is told) while rank 3 goes into a
    collective: the kernel gives the silent host up, and the timeout says the kernel lost node1's
    ranks, not that they were still running. Once the link is back, nothing stays on the hosts."""

    def cut() -> None:
        machines.cut(machines.hosts[1])
        (tmp_path / "cut").touch()

    try:
        with when_marked(tmp_path, 1, cut), pytest.raises(CollectiveTimeoutError) as info:
            notebook_launcher(
                cut_off_on_rank_three,
                (str(tmp_path),),
                num_processes=2,
                cpu=True,
                hosts=["node0", "node1"],
                ssh_config=machines.ssh_config,
                timeout=TIMEOUT_S,
            )
    finally:
        machines.mend(machines.hosts[1])
    message = str(info.value)
    lost = "was out of reach: the connection to host node1 ended while its workers (ranks 2, 3) ran"
    assert f"Ranks 2, 3 did not arrive (rank 2 {lost}" in message, message  # node1's ranks
    assert f"rank 3 {lost}" in message, message
    assert "no word from the host for 3 s" in message, message
    machines.settle()  # rank 3's own collective times out on node1, and its node ends
    assert machines.processes() == []
