"""A real Ray cluster for tests: Ray's own ``ray start`` on two machines
(:class:`~machines.BridgedMachines`), each in its own network, mount, PID and host-name
namespaces, with its own ``/tmp`` (so its own ``/tmp/ray``) and ``/dev/shm``, no default route,
and one private ``/etc/hosts`` in which every machine's name resolves to loopback (as on many
cloud images): nothing may find a node's address by its name (``loopback_names=False``: each
name resolves to its machine's address, for what needs that: Ray Train, in the benchmark).

The head is ``rayhead`` (machine 0), the other node ``raynode1``; a kernel runs on the head
(:meth:`RayCluster.on_head`), in the head's namespaces, where ``ray.init(address="auto")``
finds the cluster as a notebook on a head node does.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from machines import NETNS_ETC, BridgedMachines, Host, ip, require, run

#: The Ray head's GCS port.
GCS_PORT = 6379
#: Each node's CPUs, as Ray counts them (two ranks fit on each).
NODE_CPUS = 2
#: Each node's object store: small, the machines share 24 GiB (and tests send little).
OBJECT_STORE_BYTES = 100 * 1024 * 1024
#: How long the cluster may take to show both nodes alive.
START_WAIT_S = 90.0


def ray_program() -> str | None:
    """The ``ray`` command beside the interpreter (``None``: Ray is not installed)."""
    found = Path(sys.executable).with_name("ray")
    return str(found) if found.exists() else None


def require_ray() -> None:
    """Skip where Ray is not installed (the Ray lane's environment has it: ``make test-ray``),
    except in that lane (``NB_ACCEL_RAY_LANE=1``), where it fails."""
    if ray_program() is None:
        if os.environ.get("NB_ACCEL_RAY_LANE") == "1":
            pytest.fail("the Ray lane's environment has no `ray` (make ray-env)")
        pytest.skip("needs Ray: the Ray lane's tests (make test-ray, in .venv-ray)")


def require_ray_cluster() -> None:
    """Skip (in CI, and in the Ray lane: fail), saying why, where the cluster cannot be made."""
    require_ray()
    require(["nsenter"], [])


class RayCluster(BridgedMachines):
    """Two Ray nodes: the head ``rayhead`` and ``raynode1``; stopped, and everything made for
    them removed, at teardown."""

    #: The cluster's own processes (every process in the nodes' PID namespaces is Ray's or a
    #: launch's; a launch's are the node actors' and their node processes).
    daemons = (
        "unshare",
        "ray start",
        "gcs_server",
        "raylet",
        "ray/dashboard",
        "log_monitor",
        "monitor.py",
        "runtime_env",
        "ray::IDLE",
        "ray::DashboardAgent",
        "ray::RuntimeEnvAgent",
        "ray.util.client.server",
        "default_worker",
        "agent.py",
    )

    own_pids = True

    def __init__(
        self,
        tmp_path: Path,
        cleanup: Callable[[Callable[[], None]], None],
        loopback_names: bool = True,
    ) -> None:
        super().__init__(tmp_path, cleanup, count=2, prefix="raynode")
        self.head, self.node = self.hosts
        self.head.name = "rayhead"
        for host in self.hosts:
            # no default route: nothing reaches a node by a route it was not given
            ip("-n", host.namespace, "route", "del", "default")
            # every name loopback (``loopback_names``), else each at its own address
            names = "".join(
                f"{'127.0.1.1' if loopback_names else h.address} {h.name}\n" for h in self.hosts
            )
            (NETNS_ETC / host.namespace / "hosts").write_text("127.0.0.1 localhost\n" + names)
        #: Where the kernels' scripts go (each run on the head: :meth:`on_head`).
        self.kernels = self.folder / "kernels"
        self.kernels.mkdir()
        self._inits: dict[str, int] = {}
        self.address = f"{self.head.address}:{GCS_PORT}"
        self._start(self.head, ["--head", f"--port={GCS_PORT}", "--include-dashboard=false"])
        self._start(self.node, [f"--address={self.address}"])
        self._wait_for_nodes(2)

    def _start(self, host: Host, options: list[str]) -> None:
        """``ray start --block`` on ``host``, as the first process of a PID namespace of its
        own (``--kill-child``: it ends with the daemon), with the host's name."""
        ray = ray_program()
        assert ray is not None
        start = [
            ray,
            "start",
            "--block",
            "--disable-usage-stats",
            f"--node-ip-address={host.address}",
            f"--num-cpus={NODE_CPUS}",
            "--num-gpus=0",
            f"--object-store-memory={OBJECT_STORE_BYTES}",
            *options,
        ]
        script = f"hostname {shlex.quote(host.name)} && exec {shlex.join(start)}"
        namespaced = [
            *("unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--uts", "--"),
            *("sh", "-c", script),
        ]
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
        daemon = self.daemon(self.on(host, namespaced), env=env)
        self._inits[host.name] = self._first_in_namespace(daemon)

    def _first_in_namespace(self, daemon: subprocess.Popen[bytes]) -> int:
        """The pid (seen from here) of the first process in the daemon's PID namespace."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                children = psutil.Process(daemon.pid).children()
            except psutil.NoSuchProcess:
                break
            if children:
                return children[0].pid
            time.sleep(0.05)  # polling the process table, not ordering events
        raise RuntimeError("ray start did not start in its namespace")

    def on_head(self, command: list[str]) -> list[str]:
        """``command`` run on the head node, in its namespaces (network, mount, PID, host
        name): a kernel there finds the cluster at ``address="auto"``."""
        nsenter = shutil.which("nsenter") or "nsenter"
        target = str(self._inits[self.head.name])
        return [nsenter, "--target", target, "--mount", "--net", "--pid", "--uts", "--", *command]

    def head_root(self) -> str:
        """The head node's file system as seen from here (its own ``/tmp``, ``/dev/shm``)."""
        return f"/proc/{self._inits[self.head.name]}/root"

    def processes(self) -> list[str]:
        """The processes of launches on the machines now: neither Ray's own nor the
        kernels' (scripts in :attr:`kernels`, run on the head)."""
        return [line for line in super().processes() if str(self.kernels) not in line]

    def pids(self, host: Host, command: str) -> list[int]:
        """The pids (seen from here) of the processes on ``host`` whose command line holds
        ``command``."""
        return [
            pid for pid, (on, line) in self._running().items() if on is host and command in line
        ]

    def _wait_for_nodes(self, count: int) -> None:
        """Wait until the cluster shows ``count`` nodes alive (asked from the head)."""
        probe = (
            "import ray, sys; ray.init(address='auto', logging_level='ERROR'); "
            "print(sum(n['Alive'] for n in ray.nodes()))"
        )
        deadline = time.monotonic() + START_WAIT_S
        said = ""
        while time.monotonic() < deadline:
            done = subprocess.run(
                self.on_head([sys.executable, "-c", probe]),
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            said = done.stderr.strip()[-2000:]
            if done.returncode == 0 and done.stdout.strip().endswith(str(count)):
                return
            time.sleep(0.5)  # polling the cluster's state, not ordering events
        raise RuntimeError(f"the Ray cluster did not show {count} nodes: {said}")

    def _end_work(self) -> None:
        """Stop Ray on each node (``ray stop`` in its own namespaces) while the network is up."""
        ray = ray_program()
        for host in self.hosts:
            target = str(self._inits.get(host.name, 0))
            if target != "0" and ray is not None:
                nsenter = ["nsenter", "--target", target, "--mount", "--net", "--pid", "--"]
                run(*nsenter, ray, "stop", "--force")
