"""Multi-node launches between two machines on a real network.

Each "machine" is a network namespace of its own (its own loopback), joined to the other by a
veth pair with real addresses; each node runs in its namespace with its own host name and its
own ``/etc/hosts`` (a UTS and a mount namespace), as ``multinode_node.py`` with 2 workers. The
cases where a host name resolves to a loopback address (Debian's and Ubuntu's default
``127.0.1.1``, cloned machines) are the ones that used to hang.

Creating namespaces needs root and ``ip``/``unshare``/``hostname``; elsewhere these tests are
skipped, saying why (in CI they fail instead: :func:`machines.unavailable`).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from machines import ip, require, run, unavailable

NODE_SCRIPT = Path(__file__).with_name("multinode_node.py")
#: Longest a node may take here; a node still waiting then is a hang.
NODE_TIMEOUT_S = 90
#: Collectives may wait longer than that, so a hang is never cut short into a quick failure.
OPTIONS = ("num_nodes=2", "rdzv_timeout=60", "timeout=600")
SUBNET = "192.168.213"
PORT = 29500


@dataclass
class Machine:
    """One namespace: its name, host name, address and hosts file."""

    namespace: str
    hostname: str
    address: str
    hosts: Path


class TwoMachines:
    """Two namespaces joined by a veth pair; nodes started in them are ended at teardown."""

    def __init__(self, tmp_path: Path, cleanup: Callable[[Callable[[], None]], None]) -> None:
        tag = secrets.token_hex(3)
        self._tmp_path = tmp_path
        self._processes: list[subprocess.Popen[bytes]] = []
        self.machines = tuple(
            Machine(f"nbacc-{tag}-{i}", f"nbacc-{tag}-{i}", f"{SUBNET}.{i + 1}", tmp_path / f"h{i}")
            for i in range(2)
        )
        links = (f"nbx{tag}a", f"nbx{tag}b")
        for machine in self.machines:
            ip("netns", "add", machine.namespace)
            cleanup(lambda name=machine.namespace: run("ip", "netns", "del", name))
        ip("link", "add", links[0], "type", "veth", "peer", "name", links[1])
        cleanup(lambda: run("ip", "link", "del", links[0]))  # gone with its namespace too
        for machine, link in zip(self.machines, links, strict=True):
            ip("link", "set", link, "netns", machine.namespace)
            ip("-n", machine.namespace, "addr", "add", f"{machine.address}/24", "dev", link)
            ip("-n", machine.namespace, "link", "set", link, "up")
            ip("-n", machine.namespace, "link", "set", "lo", "up")
        cleanup(self._stop_nodes)  # the first to run at teardown
        self.hosts("", "")
        probe = self._in(self.machines[0], "true")
        done = run(*probe)
        if done.returncode != 0:
            unavailable(f"cannot give a namespace its own host name and hosts file: {done.stderr}")

    def hosts(self, first: str, second: str) -> None:
        """Write each machine's ``/etc/hosts``: localhost, then the given lines."""
        for machine, lines in zip(self.machines, (first, second), strict=True):
            machine.hosts.write_text(f"127.0.0.1 localhost\n{lines}\n")

    def _in(self, machine: Machine, *command: str) -> list[str]:
        script = 'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"'
        return [
            *("ip", "netns", "exec", machine.namespace, "unshare", "--uts", "--mount"),
            *("sh", "-c", script, "sh", machine.hostname, str(machine.hosts), *command),
        ]

    def start(
        self, node: int, endpoint: str, *options: str, env: dict[str, str] | None = None
    ) -> tuple[subprocess.Popen[bytes], Path]:
        """Start node ``node`` of a launch on machine ``node``."""
        out = self._tmp_path / f"node{node}.json"
        command = [sys.executable, str(NODE_SCRIPT), str(node), endpoint, "ok", str(out)]
        process = subprocess.Popen(
            self._in(self.machines[node], *command, *OPTIONS, *options),
            env={**os.environ, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its workers too are ended with its process group
        )
        self._processes.append(process)
        return process, out

    def _stop_nodes(self) -> None:
        for process in self._processes:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.communicate()


@pytest.fixture
def machines(tmp_path: Path, request: pytest.FixtureRequest) -> TwoMachines:
    """Two machines; everything made for them is removed at teardown, also after a failure."""
    require(["hostname"], [])
    return TwoMachines(tmp_path, request.addfinalizer)


def _finish(started: tuple[subprocess.Popen[bytes], Path]) -> dict[str, Any]:
    process, out = started
    try:
        output, _ = process.communicate(timeout=NODE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"a node hung:\n{output.decode(errors='replace')[-4000:]}")
    assert out.exists(), output.decode(errors="replace")[-4000:]
    record: dict[str, Any] = json.loads(out.read_text())
    record["output"] = output.decode(errors="replace")
    return record


def _launch(
    machines: TwoMachines, endpoints: tuple[str, str], env: dict[str, str] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    first = machines.start(0, endpoints[0], env=env)
    second = machines.start(1, endpoints[1], env=env)
    return _finish(first), _finish(second)


def _trained_together(node0: dict[str, Any], node1: dict[str, Any]) -> None:
    assert "error" not in node0, node0
    assert "error" not in node1, node1
    assert [r["rank"] for r in node0["results"]] == [0, 1]
    assert [r["rank"] for r in node1["results"]] == [2, 3]
    for record in node0["results"] + node1["results"]:
        assert record["world"] == 4
        assert record["sum"] == 1 + 2 + 3 + 4
        assert record["gathered"] == [0, 1, 2, 3]


def _names(machines: TwoMachines) -> tuple[str, str, str, str]:
    (a, b) = machines.machines
    return a.hostname, a.address, b.hostname, b.address


@pytest.mark.timeout(240)
def test_two_machines_train_together_when_each_name_is_its_own_address(
    machines: TwoMachines,
) -> None:
    name0, address0, name1, address1 = _names(machines)
    lines = f"{address0} {name0}\n{address1} {name1}"
    machines.hosts(lines, lines)
    endpoint = f"{address0}:{PORT}"
    _trained_together(*_launch(machines, (endpoint, endpoint)))


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "case",
    ["both machines have the same name", "each names itself 127.0.1.1", "endpoint by name"],
)
def test_host_names_that_resolve_to_loopback_do_not_hang_the_launch(
    machines: TwoMachines, case: str
) -> None:
    name0, address0, name1, address1 = _names(machines)
    endpoint = f"{address0}:{PORT}"
    if case == "both machines have the same name":  # cloned machines, Debian's /etc/hosts
        machines.machines[1].hostname = name0
        machines.hosts(f"127.0.1.1 {name0}", f"127.0.1.1 {name0}")
    else:  # each its own name on 127.0.1.1, the other's on its address
        machines.hosts(
            f"127.0.1.1 {name0}\n{address1} {name1}", f"127.0.1.1 {name1}\n{address0} {name0}"
        )
        if case == "endpoint by name":  # node 0's own name is loopback there
            endpoint = f"{name0}:{PORT}"
    _trained_together(*_launch(machines, (endpoint, endpoint)))


@pytest.mark.timeout(240)
def test_a_node_that_would_meet_another_machine_at_loopback_stops_every_node_at_once(
    machines: TwoMachines,
) -> None:
    name0, address0, name1, _ = _names(machines)
    machines.hosts(f"127.0.1.1 {name0}", f"127.0.1.1 {name1}")
    # node 0 is told its rendezvous is on loopback; node 1 reaches it at its address
    node0, node1 = _launch(machines, (f"127.0.0.1:{PORT}", f"{address0}:{PORT}"))
    for node in (node0, node1):
        assert node.get("error") == "LaunchError", node
        message = node["message"]
        assert f"node 1 would meet the workers of node 0 (host {name0}) at 127.0.0.1" in message
        assert "a loopback address, this machine itself" in message
        assert f"node 1 was given '{address0}:{PORT}'" in message
        assert "results" not in node  # no worker started


@pytest.mark.timeout(240)
def test_a_loopback_interface_chosen_for_gloo_stops_every_node_at_once(
    machines: TwoMachines,
) -> None:
    name0, address0, name1, address1 = _names(machines)
    lines = f"{address0} {name0}\n{address1} {name1}"
    machines.hosts(lines, lines)
    endpoint = f"{address0}:{PORT}"
    node0, node1 = _launch(machines, (endpoint, endpoint), env={"GLOO_SOCKET_IFNAME": "lo"})
    for node in (node0, node1):
        assert node.get("error") == "LaunchError", node
        assert "has GLOO_SOCKET_IFNAME='lo', a loopback interface" in node["message"]
