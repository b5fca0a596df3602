"""The kernel's side of a launch's node processes, one per host: started over the host's
transport, greeted, checked against the kernel's versions, given their jobs, read, and stopped.

Both the one-call launch (:class:`~.launcher.HostsLauncher`) and a pool spread over hosts
(:class:`~.pool_ranks.HostRanks`) drive their hosts through :class:`HostNodes`; what they do
with the workers' events is theirs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

from ..._messages import (
    AgentEnded,
    Alive,
    CellDone,
    Event,
    Failure,
    Forwarded,
    Hello,
    NodeJob,
    PromptState,
    StopNode,
    Versions,
    decode,
)
from ...errors import LaunchError, WorkerFailure
from ...worker.debugging.breakpoints import PROMPTS_VARIABLE
from ...worker.transfer.segments import INLINE_ENV
from ..debugging.prompts import follow_prompts, unfollow_prompts
from ..failures.verdict import rank_list
from ..launchers.dispatch import TICK_S
from ..multinode.restarts import worker_deaths
from ..placement.hosts import HostPlan
from ..placement.node_process import NodeProcess
from ..placement.transport import Reservation
from ..plan import LaunchPlan
from ..workers import worker_env
from .protocol import ALIVE_EVERY_S, SILENT_S, local_versions, receive, send

__all__ = ["GRACEFUL_STOP_S", "HELLO_WAIT_S", "HOST_STOP_GRACE_S", "HostNodes", "NodeChannel"]

#: How long a host may take to say hello after its connection is made (it imports torch).
HELLO_WAIT_S = 120.0
#: How long stopped hosts are given to end their workers before their channels are cut.
HOST_STOP_GRACE_S = 2.0
#: The same for hosts stopped gracefully (a launch that succeeded, a pool stopped by the user):
#: their workers end their tracker runs and exit on their own.
GRACEFUL_STOP_S = 10.0


class NodeChannel:
    """The kernel's end of one host's node process.

    Attributes:
        index: the host's number (its node rank).
        host: the host as the user named it.
        hello: what the node said first (``None`` until then).
        ended: how its agent ended (``None`` until it says).
        open: whether its channel is still open.
    """

    def __init__(self, index: int, host: str, process: NodeProcess) -> None:
        self.index = index
        self.host = host
        self.process = process
        self.reader = process.reader
        self.writer = process.writer
        self.hello: Hello | None = None
        self.ended: AgentEnded | None = None
        self.open = True
        #: When the node last said anything, once it has its job (``None`` before).
        self.heard_at: float | None = None
        #: Whether the kernel gave the host up, silent for :data:`SILENT_S`.
        self.silent = False

    def stderr_tail(self) -> str:
        """The last lines the node process (or the SSH client) wrote to its stderr."""
        return self.process.stderr_tail()

    def tell(self, message: Any) -> None:
        """Send ``message`` to the node, unless its channel has gone."""
        with contextlib.suppress(OSError, ValueError):
            send(self.writer, message)

    def messages(self) -> list[Any]:
        """The messages waiting from the node (its :class:`AgentEnded` noted); at the end of
        its channel, :attr:`open` turns false."""
        found: list[Any] = []
        try:
            while self.reader.poll():
                message = receive(self.reader)
                if self.heard_at is not None:
                    self.heard_at = time.monotonic()
                if isinstance(message, Alive):
                    continue
                if isinstance(message, AgentEnded):
                    self.ended = message
                    for note in message.notes:
                        print(f"{note} (on host {self.host})", file=sys.stderr)
                found.append(message)
        except (EOFError, OSError):
            self.open = False
        return found

    def give_up_if_silent(self) -> bool:
        """Give the host up (its channel cut) when it has had its job and said nothing for
        :data:`SILENT_S`, with nothing waiting to be read; whether it was."""
        if not self.open or self.ended is not None or self.heard_at is None:
            return False
        if time.monotonic() - self.heard_at < SILENT_S or self.reader.poll():
            return False
        self.silent, self.open = True, False
        self.process.kill()  # the transport's client (ssh, srun), or the node's actor
        return True

    def event(self, forwarded: Forwarded, host_of: Callable[[int], str] | None) -> Event:
        """The worker event inside ``forwarded``; a failure (a pool command's too) names the
        host of its rank as the user did (``host_of(rank)``; this host without it): a rank
        here that lost its peers relays the failure of a rank on another host."""
        host_of = host_of or (lambda rank: self.host)
        event = decode(forwarded.data)
        if isinstance(event, Failure):
            event = dataclasses.replace(event, host=host_of(event.rank))
        elif isinstance(event, CellDone) and event.failure is not None:
            failure = dataclasses.replace(event.failure, host=host_of(event.failure.rank))
            event = dataclasses.replace(event, failure=failure)
        return event

    def close(self) -> None:
        """End the node process (its channel's end stops the node) and reap it."""
        self.process.close(HOST_STOP_GRACE_S)


class HostNodes:
    """The node processes of one launch across ``hosts``, ``plan.num_processes`` ranks each.

    Args:
        plan: the launch's plan.
        hosts: the hosts and how they are reached.
    """

    def __init__(self, plan: LaunchPlan, hosts: HostPlan) -> None:
        self.plan = plan
        self.hosts = hosts
        self.nodes: list[NodeChannel] = []
        self._reservation: Reservation | None = None

    def start(self, payload: bytes, max_restarts: int | None = None) -> None:
        """Start every host's node process, check their versions, and send each its job with
        ``payload`` (the pickled call); a :class:`LaunchError` naming the host when one cannot
        take part (nothing started anywhere then)."""
        resource = self.plan.device.cluster_resource
        per_host = self.plan.num_processes
        reservation = self.hosts.transport.reserve(self.hosts.hosts, per_host, resource)
        self._reservation = reservation
        for index, host in enumerate(reservation.hosts):
            process = reservation.start(index, self.hosts.python)
            self.nodes.append(NodeChannel(index, host, process))
        for node in self.nodes:
            self._greet(node)
        mismatched = self._mismatched(local_versions())
        if mismatched:
            raise LaunchError(mismatched)
        first = self.nodes[0]
        assert first.hello is not None
        endpoint = f"{reservation.address(0)}:{first.hello.free_port}"
        # Big buffers travel inside the workers' messages: the kernel cannot map the hosts' files.
        # Breakpoints and input() ask in the kernel, through the node (ToWorker answers).
        env = {**worker_env(self.plan, single_node=False), INLINE_ENV: "1", PROMPTS_VARIABLE: "1"}
        for node in self.nodes:
            nodes = self.hosts.node_plan(node.index, endpoint, max_restarts)
            node.tell(NodeJob(self.plan, nodes, payload, env))
            node.heard_at = time.monotonic()  # from now on it says it is alive
        follow_prompts(self.tell_prompt)  # the hosts' ranks leave time at prompts out

    def tell_prompt(self, is_open: bool) -> None:
        """Tell every host that a prompt of the kernel opened or closed (their prompt clocks)."""
        for node in self.nodes:
            if node.open:
                node.tell(PromptState(is_open))

    def _greet(self, node: NodeChannel) -> None:
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

    def _no_hello(self, node: NodeChannel) -> str:
        """Why ``node`` never said hello, with what to do about it."""
        try:
            node.process.wait(5)
        except subprocess.TimeoutExpired:
            return (
                f"host {node.host} did not answer within {HELLO_WAIT_S:g} s of connecting "
                f"({self.hosts.transport.name}); is it overloaded?"
            )
        said = node.stderr_tail() or "nothing"
        transport = self.hosts.transport
        code = node.process.poll()
        if node.process.unreachable():
            return (
                f"host {node.host} could not be reached over {transport.name}: {said}. Check "
                f"that `{transport.name} {node.host}` works from this machine without a "
                "password prompt (keys or an agent), and the host name"
            )
        return (
            f"nb_accel could not start on host {node.host} with {self.hosts.python} (exit code "
            f"{code}): {said}. Install the kernel's versions of nb_accel and "
            "torch there, or name the interpreter that has them"
        )

    def _mismatched(self, mine: Versions) -> str:
        """The hosts whose versions differ from the kernel's, in words ("" when none)."""
        lines = []
        for node in self.nodes:
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

    def readable(self, timeout: float | None) -> list[NodeChannel]:
        """The open nodes with messages waiting (waiting up to ``timeout`` for one, and no
        longer than a node's sign of life takes: a silent host is given up meanwhile, and
        counts as readable, at the end of its channel)."""
        silent = [node for node in self.nodes if node.give_up_if_silent()]
        readers = {node.reader: node for node in self.nodes if node.open}
        if not readers:
            return silent
        timeout = ALIVE_EVERY_S if timeout is None else min(timeout, ALIVE_EVERY_S)
        ready = [readers[conn] for conn in wait(list(readers), timeout)]  # type: ignore[index]
        return silent + ready

    def broken(self) -> list[NodeChannel]:
        """The hosts that can no longer take part: the channel ended before the agent did
        (the connection dropped), or the agent ended on a problem (the rendezvous)."""
        return [
            node
            for node in self.nodes
            if (not node.open and node.ended is None) or (node.ended and node.ended.problem)
        ]

    def deaths(
        self, node: NodeChannel, reported: set[int], stderr_tail: dict[int, str]
    ) -> list[WorkerFailure]:
        """The failures of ``node``'s workers that died without reporting (not those in
        ``reported``, nor those their agent stopped after another failure)."""
        if node.ended is None:
            return []
        per_node = self.plan.num_processes
        died = node.ended.died
        return worker_deaths(node.index, died, per_node, reported, stderr_tail, host=node.host)

    def problem(self, node: NodeChannel) -> str:
        """What stopped ``node`` without a failure of its workers, in words."""
        if node.ended is not None:
            return f"host {node.host}: {node.ended.problem}"
        return f"{self.lost(node)}; the launch was stopped on every host"

    def lost(self, node: NodeChannel) -> str:
        """How the connection to ``node`` ended while its workers ran, in words."""
        if node.silent:
            said = (
                f"no word from the host for {SILENT_S:g} s, as when it is cut off the network "
                "or down: the kernel gave it up"
            )
        else:
            code = node.process.poll()
            said = f"exit code {code}: {node.stderr_tail() or 'nothing on its stderr'}"
        per_node = self.plan.num_processes
        ranks = rank_list(range(node.index * per_node, (node.index + 1) * per_node))
        return f"the connection to host {node.host} ended while its workers ({ranks}) ran ({said})"

    def stop(self, grace_s: float = HOST_STOP_GRACE_S, keep: NodeChannel | None = None) -> None:
        """Tell every host to stop, give them ``grace_s``, then cut their channels; all but
        ``keep``, where given (a rank there is kept for ``%debug``): it is left running, and
        the hosts are held for it until the next stop."""
        unfollow_prompts(self.tell_prompt)
        stopping = [node for node in self.nodes if node is not keep]
        for node in stopping:
            if node.open:
                node.tell(StopNode())
        deadline = time.monotonic() + grace_s
        for node in stopping:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.process.wait(max(deadline - time.monotonic(), 0.0))
        for node in stopping:
            if node.open:
                node.messages()  # its last words: how it ended, what it said of the runs
            node.close()
        self.nodes = [node for node in self.nodes if node is keep]
        if keep is None and self._reservation is not None:
            self._reservation.release()
            self._reservation = None
