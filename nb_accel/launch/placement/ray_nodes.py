"""The nodes of a Ray cluster held for one launch or pool: one placement group with a bundle of
the ranks' GPUs (or CPUs) on each node (``STRICT_SPREAD``: one node per bundle), and in each
bundle a node actor (:class:`NodeHolder`) that starts the node's process, the one every host
runs (``python -m nb_accel.launch.hosts.remote_node``: torch's elastic agent for the node's
ranks).

The kernel's channel to a node process is a TCP connection: the actor listens on its node's
address, the kernel connects and proves itself with a secret, and the node process gets the
connection as its standard input and output, as it gets ``ssh``'s elsewhere. The node process
inherits the actor's environment (Ray's ``CUDA_VISIBLE_DEVICES`` for the bundle's GPUs) and
dies with it (``setpriv --pdeathsig``, from the thread that waits for it); the channel's end
stops it, as on any host. :meth:`RayReservation.release` kills the actors and removes the
placement group, on every way out.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections import defaultdict
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from ...errors import LaunchError
from .node_process import NodeProcess, StderrTail
from .transport import NODE_MODULE, Reservation

__all__ = [
    "HELD",
    "PLACE_WAIT_S",
    "NodeHolder",
    "RayNode",
    "RayNodeProcess",
    "RayReservation",
    "node_environment",
]

#: How long the cluster may take to place the launch's bundles.
PLACE_WAIT_S = 60.0
#: How long a call to a node actor may take before its node counts as out of reach.
ACTOR_CALL_S = 30.0
#: The secret's length, in bytes.
SECRET_BYTES = 32
#: What Ray sets in its worker processes for themselves, left out of the node process's
#: environment: its ranks are no Ray workers (``PYTHONBREAKPOINT`` would send their
#: ``breakpoint()`` to Ray's debugger instead of the kernel).
RAY_WORKER_VARIABLES = ("RAY_JOB_ID", "RAY_RAYLET_PID", "RAY_LD_PRELOAD_ON_WORKERS", "SPT_NOENV")


def node_environment(environ: dict[str, str], actor_cpus: int) -> dict[str, str]:
    """The node process's environment: the actor's (``CUDA_VISIBLE_DEVICES`` for its bundle's
    GPUs included) less what Ray set for its own workers: :data:`RAY_WORKER_VARIABLES`, its
    ``PYTHONBREAKPOINT``, and the ``OMP_NUM_THREADS`` it sets to the actor's CPUs (each rank
    shares the node's cores instead, unless the cluster set the variable itself)."""
    env = {k: v for k, v in environ.items() if k not in RAY_WORKER_VARIABLES}
    if env.get("PYTHONBREAKPOINT", "").startswith("ray."):
        del env["PYTHONBREAKPOINT"]
    if env.get("OMP_NUM_THREADS") == str(max(actor_cpus, 1)):
        del env["OMP_NUM_THREADS"]
    return env


@dataclass(frozen=True)
class RayNode:
    """One alive node of the cluster, as a launch sees it.

    Attributes:
        node_id: Ray's id of the node.
        address: the node's IP address (Ray's ``NodeManagerAddress``).
        resources: its resources, as Ray counts them (``{"CPU": 8.0, "GPU": 2.0, ...}``).
    """

    node_id: str
    address: str
    resources: tuple[tuple[str, float], ...]

    def count(self, resource: str) -> float:
        """How many of ``resource`` it has."""
        return dict(self.resources).get(resource, 0.0)


def _no_delay(sock: socket.socket) -> None:
    """Send each frame at once: the channel's messages are small and answered rarely, and
    Nagle's algorithm would hold the second of two until the first's (delayed) ACK."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


#: What this process's live reservations hold, by (node id, resource): its warm workers' and
#: its running launch's bundles.
HELD: defaultdict[tuple[str, str], float] = defaultdict(float)


def _check_own_holds(nodes: list[RayNode | None], per_host: int, resource: str) -> None:
    """A :class:`~nb_accel.errors.LaunchError` where what this process holds already leaves a
    node fewer than ``per_host`` of ``resource`` (Ray would wait for them in vain)."""
    for node in nodes:
        if node is None:
            continue
        held = HELD[(node.node_id, resource)]
        total = node.count(resource)
        if held > 0 and held + per_host > total:
            raise LaunchError(
                f"node {node.address} has {total:g} {resource}s and this kernel holds {held:g} "
                f"of them already (its warm workers: reuse_workers=True or %%distributed), so "
                f"{per_host} more cannot be placed there: stop them with nb_accel.stop_workers() "
                "(or %distributed stop), or launch on them with reuse_workers=True"
            )


class NodeHolder:
    """The node actor: holds its bundle's resources for the launch and runs the node process.

    Ray runs it on the node (a threaded actor: :meth:`exit_code` waits while the others
    answer).
    """

    def __init__(self, cpus: int) -> None:
        self._cpus = cpus
        self._listener: socket.socket | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._stderr: StderrTail | None = None
        self._started = threading.Event()
        self._ended = threading.Event()
        self._code: int | None = None

    def listen(self) -> tuple[str, int]:
        """Listen on the node's address; that address and the port."""
        import ray

        address = ray.util.get_node_ip_address()
        self._listener = socket.create_server((address, 0))
        return address, int(self._listener.getsockname()[1])

    def serve(self, secret: bytes, python: str | None) -> None:
        """Accept the kernel's connection (the one that sends ``secret`` first) and start the
        node process on it, with ``python`` (``None``: this actor's interpreter); returns once
        it started."""
        assert self._listener is not None, "listen() first"
        self._listener.settimeout(ACTOR_CALL_S)
        with self._listener:
            while True:
                conn, _ = self._listener.accept()
                conn.settimeout(ACTOR_CALL_S)
                said = b""
                with contextlib.suppress(OSError):
                    while len(said) < len(secret):
                        chunk = conn.recv(len(secret) - len(said))
                        if not chunk:
                            break
                        said += chunk
                if secrets.compare_digest(said, secret):
                    break
                conn.close()
        conn.settimeout(None)
        _no_delay(conn)
        command = [python or sys.executable, "-m", NODE_MODULE]
        thread = threading.Thread(target=self._run, args=(command, conn), daemon=True)
        thread.start()  # the node process dies with this thread (its parent, to the kernel)
        self._started.wait()

    def _run(self, command: list[str], conn: socket.socket) -> None:
        setpriv = shutil.which("setpriv")
        if setpriv:
            command = [setpriv, "--pdeathsig", "KILL", "--", *command]
        try:
            with conn:
                self._process = subprocess.Popen(
                    command,
                    env=node_environment(dict(os.environ), self._cpus),
                    stdin=conn.fileno(),
                    stdout=conn.fileno(),
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                )
            self._stderr = StderrTail(self._process.stderr)
        finally:
            self._started.set()
        self._code = self._process.wait()
        self._ended.set()

    def exit_code(self) -> int:
        """The node process's exit code, once it ended."""
        self._ended.wait()
        assert self._code is not None
        return self._code

    def stderr_tail(self) -> str:
        """What the node process wrote to its standard error, last lines."""
        return self._stderr.text(0.5) if self._stderr is not None else ""

    def kill(self) -> None:
        """Kill the node process (its workers die with it)."""
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGKILL)


class RayNodeProcess(NodeProcess):
    """The kernel's hold on a node process a node actor started: the TCP channel, the actor.

    Args:
        ray: the connected ``ray`` module.
        actor: the node's actor.
        python: the interpreter the node runs (``None``: the actor's).
    """

    def __init__(self, ray: Any, actor: Any, python: str | None) -> None:
        self._ray = ray
        self._actor = actor
        self._died: str | None = None
        address, port = ray.get(actor.listen.remote(), timeout=ACTOR_CALL_S)
        secret = secrets.token_bytes(SECRET_BYTES)
        served = actor.serve.remote(secret, python)
        with socket.create_connection((address, port), timeout=ACTOR_CALL_S) as sock:
            sock.sendall(secret)
            sock.settimeout(None)
            _no_delay(sock)
            self.reader = Connection(os.dup(sock.fileno()), writable=False)
            self.writer = Connection(os.dup(sock.fileno()), readable=False)
        ray.get(served, timeout=ACTOR_CALL_S)
        self._exit = actor.exit_code.remote()

    def _code(self, timeout: float | None) -> int | None:
        ready, _ = self._ray.wait([self._exit], timeout=timeout)
        if not ready:
            return None
        try:
            return int(self._ray.get(self._exit))
        except self._ray.exceptions.RayActorError as error:
            self._died = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
            return -int(signal.SIGKILL)

    def poll(self) -> int | None:
        """The node process's exit code, once it ended (``-9`` where its actor died)."""
        return self._code(0)

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the node process's end."""
        code = self._code(timeout)
        if code is None:
            raise subprocess.TimeoutExpired("ray node", timeout or 0)
        return code

    def kill(self) -> None:
        """Kill the node process through its actor, and the actor."""
        with contextlib.suppress(Exception):
            self._actor.kill.remote()
        self._ray.kill(self._actor, no_restart=True)

    def stderr_tail(self) -> str:
        """The node process's standard error, last lines (or how its actor died)."""
        if self._died is not None:
            return f"its Ray actor died: {self._died}"
        try:
            return str(self._ray.get(self._actor.stderr_tail.remote(), timeout=5))
        except Exception as error:  # noqa: BLE001 - the actor or its node is gone
            return f"its Ray actor did not answer: {type(error).__name__}"


class RayReservation(Reservation):
    """The placement group and node actors of one launch or pool across ``hosts`` (node
    addresses, node 0 first; ``nodes``: what the cluster said of each, where known), ``per_host``
    of ``resource`` (``"GPU"``, ``"CPU"``) on each.

    A :class:`~nb_accel.errors.LaunchError` at once when this kernel's own reservations (its
    warm workers) leave a node too little, and when the cluster cannot place the bundles
    within :data:`PLACE_WAIT_S` (nothing is left then).
    """

    def __init__(
        self,
        ray: Any,
        nodes: list[RayNode | None],
        hosts: tuple[str, ...],
        per_host: int,
        resource: str,
    ) -> None:
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self._ray = ray
        self._remove = remove_placement_group
        self.hosts = hosts
        self._actors: list[Any] = []
        self._held = [(node.node_id, resource, float(per_host)) for node in nodes if node]
        _check_own_holds(nodes, per_host, resource)
        bundle = {resource: float(per_host)}
        # each bundle on the node found for it (node 0: the kernel's), where all are known
        selectors = [{"ray.io/node-id": node.node_id} for node in nodes if node is not None]
        self._group = placement_group(
            [dict(bundle) for _ in hosts],
            strategy="STRICT_SPREAD",
            bundle_label_selector=selectors if len(selectors) == len(hosts) else None,
        )
        for held in self._held:
            HELD[held[:2]] += held[2]
        if not self._group.wait(timeout_seconds=PLACE_WAIT_S):
            self.release()
            raise LaunchError(
                f"the Ray cluster did not place {len(hosts)} bundle(s) of {per_host} {resource}(s) "
                f"on {len(hosts)} different node(s) within {PLACE_WAIT_S:g} s: other work holds "
                "them (ray status shows what is free), or a node left the cluster"
            )
        holder = ray.remote(NodeHolder)
        for index in range(len(hosts)):
            strategy = PlacementGroupSchedulingStrategy(self._group, index)
            options: dict[str, Any] = {"num_cpus": 0, "max_concurrency": 8}
            if resource == "CPU":
                options["num_cpus"] = per_host
            elif resource == "GPU":
                options["num_gpus"] = per_host
            else:
                options["resources"] = {resource: per_host}
            actor = holder.options(scheduling_strategy=strategy, **options).remote(
                int(options["num_cpus"])
            )
            self._actors.append(actor)

    def start(self, index: int, python: str) -> NodeProcess:
        """Host ``index``'s node process, started by its actor."""
        configured = None if python == sys.executable else python
        return RayNodeProcess(self._ray, self._actors[index], configured)

    def address(self, index: int) -> str:
        """Node ``index``'s address."""
        return self.hosts[index]

    def release(self) -> None:
        """Kill the node actors and remove the placement group."""
        for actor in self._actors:
            with contextlib.suppress(Exception):
                self._ray.kill(actor, no_restart=True)
        self._actors = []
        with contextlib.suppress(Exception):
            self._remove(self._group)
        for node_id, resource, amount in self._held:
            HELD[(node_id, resource)] -= amount
        self._held = []
