"""A launch across hosts driven from the kernel: a node process on each host (over SSH, or
``srun`` in a SLURM allocation) runs torch's elastic agent for that host's ranks, and sends
every worker's events back over its channel.

The kernel starts the node processes, reads each one's hello and checks its versions against
its own before anything else starts; host 0's free port (on the address the others reach it
at) becomes the c10d rendezvous, which host 0's agent listens on. Then each host gets its
:class:`~.protocol.NodeJob` (the function and its arguments travel in it: no shared
filesystem is needed). The workers' events go to one dispatcher, as if they were this
machine's: results in rank order, failures judged across hosts (each names its host). When the
launch fails or is interrupted, or the kernel goes away, every host stops its workers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import threading
import time
from multiprocessing.connection import Connection, wait
from typing import Any

from ..._messages import Failure, decode
from ...errors import LaunchError
from ...runtime.transfer.pickling import Pickled
from ...runtime.workers.node_worker import global_rank
from ..failures.verdict import died_failure
from ..launchers.dispatch import TICK_S
from ..launchers.interface import Launcher
from ..launchers.outcome import launch_outcome
from ..multinode.node_events import NodeHooks
from ..multinode.nodes import NodePlan
from ..payload import LaunchPayload
from ..plan import LaunchPlan
from ..views.output import OutputPrinter
from ..views.view import LaunchView
from ..workers import worker_env
from .plan import HostPlan
from .protocol import (
    AgentEnded,
    Forwarded,
    Hello,
    NodeJob,
    StopNode,
    Versions,
    local_versions,
    receive,
    send,
)

__all__ = ["HostsLauncher"]

#: How long a host may take to say hello after its connection is made (it imports torch).
HELLO_WAIT_S = 120.0
#: How long stopped hosts are given to end their workers before their channels are cut.
STOP_GRACE_S = 2.0
#: After the first failure, how long to keep listening for the other ranks' reports.
COLLECT_WINDOW_S = 0.5
#: The same while every failure so far looks like a consequence (a lost connection): the
#: cause may still be on its way (a worker's death is known once its host's agent noticed it).
EXPLAIN_WINDOW_S = 5.0
#: Exit codes of workers their agent stopped (SIGTERM) after another failure: not causes.
_STOPPED_CODES = (-signal.SIGTERM, 128 + signal.SIGTERM)


def _dying_with_the_kernel(command: list[str]) -> list[str]:
    """``command`` run so that it is killed when the kernel dies (util-linux's ``setpriv
    --pdeathsig``, kept across ``exec``), which ends the channel, which stops the host's node
    and its workers; as it is where ``setpriv`` is missing."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--", *command] if setpriv else command


class _Node:
    """The kernel's end of one host's node process."""

    def __init__(self, index: int, host: str, command: list[str]) -> None:
        self.index = index
        self.host = host
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # the kernel's interrupt is the kernel's to pass on
        )
        assert self.process.stdin and self.process.stdout and self.process.stderr
        self.reader = Connection(os.dup(self.process.stdout.fileno()), writable=False)
        self.writer = Connection(os.dup(self.process.stdin.fileno()), readable=False)
        self._stderr: list[str] = []
        self._errors = threading.Thread(target=self._read_stderr, daemon=True)
        self._errors.start()
        self.hello: Hello | None = None
        self.ended: AgentEnded | None = None
        self.open = True

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        for line in iter(self.process.stderr.readline, b""):
            self._stderr.append(line.decode(errors="replace"))
            del self._stderr[:-40]

    def stderr_tail(self) -> str:
        """The last lines the node process (or the SSH client) wrote to its stderr."""
        self._errors.join(1.0)
        return "".join(self._stderr).strip()

    def tell(self, message: Any) -> None:
        """Send ``message`` to the node, unless its channel has gone."""
        with contextlib.suppress(OSError, ValueError):
            send(self.writer, message)

    def close(self) -> None:
        """End the node process (its channel's end stops the node) and reap it."""
        for conn in (self.writer, self.reader):
            conn.close()
        for stream in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError):
                stream.close()  # type: ignore[union-attr]
        try:
            self.process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self._errors.join(5)
        if self.process.stderr is not None:
            self.process.stderr.close()


class HostsLauncher(Launcher):
    """A launch of ``plan.num_processes`` ranks on each of ``hosts.hosts``.

    Args:
        plan: the launch's plan (``num_processes`` ranks on each host).
        hosts: the hosts and how they are reached.
        payload: the function and its arguments, pickled (they travel to the hosts).
        prefix_output: prefix each line of output with its rank.
        view: the launch's view, a row for every rank.
    """

    def __init__(
        self,
        plan: LaunchPlan,
        hosts: HostPlan,
        payload: LaunchPayload,
        prefix_output: bool,
        view: LaunchView,
    ) -> None:
        self._plan = plan
        self._hosts = hosts
        self._payload = payload
        world = plan.num_processes * len(hosts.hosts)
        per_host = plan.num_processes
        self._printer = OutputPrinter(
            world, prefix_output, view=view, place_of=lambda rank: hosts.hosts[rank // per_host]
        )
        self.view = self._printer.view
        self._events = NodeHooks(self._printer, self.view)
        self._nodes: list[_Node] = []

    @property
    def world_size(self) -> int:
        """Ranks in the launch."""
        return self._plan.num_processes * len(self._hosts.hosts)

    def start(self) -> None:
        """Start every host's node process, check their versions, and send the jobs."""
        transport = self._hosts.transport
        for index, host in enumerate(self._hosts.hosts):
            command = _dying_with_the_kernel(transport.command(host, self._hosts.python))
            self._nodes.append(_Node(index, host, command))
        for node in self._nodes:
            self._greet(node)
        mismatched = self._mismatched(local_versions())
        if mismatched:
            raise LaunchError(mismatched)
        first = self._nodes[0]
        assert first.hello is not None
        endpoint = f"{transport.address(first.host)}:{first.hello.free_port}"
        if not isinstance(self._payload, Pickled):
            raise TypeError("a launch across hosts sends its call pickled")
        payload = self._payload.seal(None)  # big buffers inside: no shared memory across hosts
        env = worker_env(self._plan, single_node=False)
        for node in self._nodes:
            nodes = NodePlan(
                num_nodes=len(self._nodes),
                node_rank=node.index,
                rdzv_endpoint=endpoint,
                max_restarts=self._hosts.max_restarts,
                rdzv_timeout=self._hosts.rdzv_timeout,
            )
            node.tell(NodeJob(self._plan, nodes, payload, env))

    def _greet(self, node: _Node) -> None:
        """Read ``node``'s hello; a :class:`LaunchError` naming the host when none comes."""
        deadline = time.monotonic() + HELLO_WAIT_S
        while time.monotonic() < deadline:
            if node.reader.poll(TICK_S):
                try:
                    data = receive(node.reader)
                except (EOFError, OSError):
                    break
                if isinstance(data, dict):
                    node.hello = Hello.from_dict(data)
                    return
                break
            if node.process.poll() is not None and not node.reader.poll(0):
                break
        raise LaunchError(self._no_hello(node))

    def _no_hello(self, node: _Node) -> str:
        """Why ``node`` never said hello, with what to do about it."""
        try:
            node.process.wait(5)
        except subprocess.TimeoutExpired:
            return (
                f"host {node.host} did not answer within {HELLO_WAIT_S:g} s of connecting "
                f"({self._hosts.transport.name}); is it overloaded?"
            )
        said = node.stderr_tail() or "nothing"
        transport = self._hosts.transport
        if transport.unreachable(node.process.returncode):
            return (
                f"host {node.host} could not be reached over {transport.name}: {said}. Check "
                f"that `{transport.name} {node.host}` works from this machine without a "
                "password prompt (keys or an agent), and the host name"
            )
        return (
            f"nb_accel could not start on host {node.host} with {self._hosts.python} (exit code "
            f"{node.process.returncode}): {said}. Install the kernel's versions of nb_accel and "
            "torch there, or name the interpreter that has them"
        )

    def _mismatched(self, mine: Versions) -> str:
        """The hosts whose versions differ from the kernel's, in words ("" when none)."""
        lines = []
        for node in self._nodes:
            assert node.hello is not None
            differences = node.hello.versions.differences(mine)
            if differences:
                lines.append(
                    f"host {node.host} ({node.hello.executable}): " + ", ".join(differences)
                )
        if not lines:
            return ""
        return (
            "the hosts must run the kernel's versions of Python, torch and nb_accel, and "
            + ("these do not: " if len(lines) > 1 else "this one does not: ")
            + "; ".join(lines)
            + ". Install the same versions there (nothing was started)"
        )

    def wait(self) -> list[Any] | BaseException:
        """Pass the workers' events on until every host has ended; the results in rank order,
        or the exception to raise."""
        failed_at: float | None = None
        log = self._events.failures
        while any(node.open for node in self._nodes):
            if (log or self._broken()) and failed_at is None:
                failed_at = time.monotonic()
            window = COLLECT_WINDOW_S if log.has_cause or self._broken() else EXPLAIN_WINDOW_S
            if failed_at is not None and time.monotonic() - failed_at > window:
                for node in self._nodes:
                    if node.open and node.ended is None:
                        node.tell(StopNode())  # the outcome is known: the others stop
            due = self._events.events.wake()
            readers = {node.reader: node for node in self._nodes if node.open}
            for ready in wait(list(readers), TICK_S if due is None else max(due, 0.0)):
                self._read(readers[ready])  # type: ignore[index]
        self._printer.flush()
        return self._outcome()

    def _broken(self) -> bool:
        """Whether a host can no longer take part: its channel ended before its agent did
        (the connection dropped), or its agent ended on a problem (the rendezvous): the
        others would wait for it in vain."""
        return any(
            (not node.open and node.ended is None) or (node.ended and node.ended.problem)
            for node in self._nodes
        )

    def _read(self, node: _Node) -> None:
        """Handle the messages waiting from ``node``; note its end."""
        try:
            while node.reader.poll():
                message = receive(node.reader)
                if isinstance(message, Forwarded):
                    event = decode(message.data)
                    if isinstance(event, Failure):  # the host as the user named it
                        event = dataclasses.replace(event, host=node.host)
                    self._events.events.handle(event, (node.index, message.sender))
                elif isinstance(message, AgentEnded):
                    node.ended = message
                    self._note_deaths(node, message)
        except (EOFError, OSError):
            node.open = False

    def _note_deaths(self, node: _Node, ended: AgentEnded) -> None:
        """Record the workers of ``node`` that died without reporting (not those that reported
        a failure first, nor those their agent stopped after one)."""
        log = self._events.failures
        for local_rank, pid, exitcode in ended.died:
            rank = global_rank(node.index, local_rank, self._plan.num_processes)
            reported = rank in log.ranks or rank in self._events.results
            if reported or exitcode in _STOPPED_CODES:
                continue
            last_words = self._events.stderr_tail.get(rank, "")
            log.add(died_failure(rank, pid, exitcode, last_words, host=node.host))

    def _outcome(self) -> list[Any] | BaseException:
        log = self._events.failures
        if not log:
            problems = [node for node in self._nodes if node.ended is None or node.ended.problem]
            if problems:
                return LaunchError(self._problem(problems[0]))
        ranks = list(range(self.world_size))
        if not log and not all(rank in self._events.results for rank in ranks):
            return LaunchError("the workers ended without reporting a result")
        return launch_outcome(
            self._events.results, log, ranks, self.world_size, self._plan.timeout_s
        )

    def _problem(self, node: _Node) -> str:
        """What stopped ``node`` without a failure of its workers."""
        if node.ended is not None:
            return f"host {node.host}: {node.ended.problem}"
        said = node.stderr_tail() or "nothing on its stderr"
        return (
            f"the connection to host {node.host} ended while its workers ran (exit code "
            f"{node.process.poll()}: {said}); the launch was stopped on every host"
        )

    def stop(self, graceful: bool = False) -> None:
        """Tell every host to stop, give them :data:`STOP_GRACE_S`, then cut their channels."""
        for node in self._nodes:
            if node.open:
                node.tell(StopNode())
        deadline = time.monotonic() + (STOP_GRACE_S if not graceful else 10.0)
        for node in self._nodes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.process.wait(max(deadline - time.monotonic(), 0.0))
        for node in self._nodes:
            node.close()
        self._nodes = []
