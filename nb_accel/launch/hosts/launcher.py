"""A launch across hosts driven from the kernel: a node process on each host (over SSH, or
``srun`` in a SLURM allocation) runs torch's elastic agent for that host's ranks, and sends
every worker's events back over its channel.

The kernel starts the node processes, reads each one's hello and checks its versions against
its own before anything else starts; host 0's free port (on the address the others reach it
at) becomes the c10d rendezvous, which host 0's agent listens on. Then each host gets its
:class:`~nb_accel._messages.NodeJob` (the function and its arguments travel in it: no shared
filesystem is needed). The workers' events go to one dispatcher, as if they were this
machine's: results in rank order, failures judged across hosts (each names its host). When the
launch fails or is interrupted, or the kernel goes away, every host stops its workers.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any, ClassVar

from ..._messages import AgentEnded, AgentRestarting, Forwarded, Prompt, StopNode, ToWorker
from ...errors import LaunchError
from ...worker.transfer.pickling import Pickled
from ..debugging.prompts import answer_prompt
from ..launchers.backend import LaunchBackend
from ..launchers.dispatch import TICK_S
from ..launchers.outcome import launch_outcome
from ..multinode.node_events import NodeHooks
from ..multinode.restarts import with_restarts
from ..payload import LaunchPayload, launch_payload
from ..request import LaunchCall
from ..spec import LaunchSpec
from .connections import GRACEFUL_STOP_S, HOST_STOP_GRACE_S, HostNodes, NodeChannel

__all__ = ["HostsLauncher"]

#: After the first failure, how long to keep listening for the other ranks' reports: longer
#: than on one machine (:data:`~nb_accel.launch.failures.failure_log.COLLECT_WINDOW_S`), as
#: they come through each host's node.
HOSTS_COLLECT_WINDOW_S = 0.5
#: The same while every failure so far looks like a consequence (a lost connection): the
#: cause may still be on its way (a worker's death is known once its host's agent noticed it).
HOSTS_EXPLAIN_WINDOW_S = 5.0


def _to_worker(node: NodeChannel, forwarded: Forwarded, data: bytes) -> None:
    """Write ``data`` to the worker that sent ``forwarded``, through its host's node."""
    node.tell(ToWorker(forwarded.sender, data))


class HostsLauncher(LaunchBackend):
    """A launch of ``plan.num_processes`` ranks on each of the spec's hosts, driven from here."""

    name: ClassVar[str] = "hosts"

    @classmethod
    def runs(cls, spec: LaunchSpec) -> bool:
        """A launch with hosts."""
        return spec.device.launcher is None and spec.hosts is not None

    def __init__(self, spec: LaunchSpec, call: LaunchCall) -> None:
        super().__init__(spec, call)
        assert spec.hosts is not None, "a launch across hosts has hosts"
        self._plan = spec.plan
        self._hosts = HostNodes(spec.plan, spec.hosts)
        self._max_restarts = spec.hosts.agent.max_restarts
        self._events = NodeHooks(self.printer, self.view, self._max_restarts)

    def make_payload(self, call: LaunchCall) -> LaunchPayload:
        """The call pickled, with the function's own module by value unless installed: the
        hosts may not have the user's files."""
        return launch_payload(call.function, call.args, call.kwargs, False, elsewhere=True)

    @property
    def world_size(self) -> int:
        """Ranks in the launch."""
        return self.spec.world_size

    def start(self) -> None:
        """Start every host's node process, check their versions, and send the jobs."""
        if not isinstance(self.payload, Pickled):
            raise TypeError("a launch across hosts sends its call pickled")
        self._hosts.start(self.payload.seal(None))  # no shared memory across hosts

    def wait(self) -> list[Any] | BaseException:
        """Pass the workers' events on until every host has ended; the results in rank order,
        or the exception to raise."""
        failed_at: float | None = None
        nodes = self._hosts.nodes
        while any(node.open for node in nodes):
            log = self._events.failures  # this attempt's (the agents may restart the group)
            broken = bool(self._hosts.broken())
            restarting = self._events.attempt < self._max_restarts and not broken
            if restarting:
                failed_at = None  # the agents restart the workers after a failure
            elif (log or broken) and failed_at is None:
                failed_at = time.monotonic()
            window = HOSTS_COLLECT_WINDOW_S if log.has_cause or broken else HOSTS_EXPLAIN_WINDOW_S
            if failed_at is not None and time.monotonic() - failed_at > window:
                for node in nodes:
                    if node.open and node.ended is None:
                        node.tell(StopNode())  # the outcome is known: the others stop
            due = self._events.events.wake()
            for node in self._hosts.readable(TICK_S if due is None else max(due, 0.0)):
                self._read(node)
        self.printer.flush()
        return self._outcome()

    def _read(self, node: NodeChannel) -> None:
        """Handle the messages waiting from ``node``."""
        for message in node.messages():
            if isinstance(message, Forwarded):
                event = node.event(message)
                if isinstance(event, Prompt):  # a rank's debugger or input(): asked here
                    answer_prompt(event, self.printer.flush, partial(_to_worker, node, message))
                    continue
                self._events.events.handle(event, (node.index, message.sender))
            elif isinstance(message, AgentRestarting):
                self._events.agent_restarting(
                    node.index,
                    message.attempt,
                    message.died,
                    self._plan.num_processes,
                    host=node.host,
                )
            elif isinstance(message, AgentEnded):
                log = self._events.failures
                reported = log.ranks | set(self._events.results)
                for failure in self._hosts.deaths(node, reported, self._events.stderr_tail):
                    log.add(failure)

    def _outcome(self) -> list[Any] | BaseException:
        log = self._events.failures
        if not log:
            problems = [n for n in self._hosts.nodes if n.ended is None or n.ended.problem]
            if problems:
                return LaunchError(self._hosts.problem(problems[0]))
        ranks = list(range(self.world_size))
        if not log and not all(rank in self._events.results for rank in ranks):
            return LaunchError("the workers ended without reporting a result")
        outcome = launch_outcome(
            self._events.results, log, ranks, self.world_size, self._plan.timeout_s
        )
        with_restarts(outcome, self._events.restarts, log)
        return outcome

    def stop(self, graceful: bool = False) -> None:
        """Tell every host to stop, give them :data:`HOST_STOP_GRACE_S` (more after a success),
        then cut their channels."""
        try:
            self._hosts.stop(GRACEFUL_STOP_S if graceful else HOST_STOP_GRACE_S)
        finally:
            self._events.events.close()  # its hooks hold it: a cycle otherwise
