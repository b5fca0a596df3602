"""A pool spread over hosts: ``%%distributed`` ranks on several machines, driven from here.

Each host runs a node process (as a launch across hosts does) whose elastic agent starts that
host's ranks once, running the pool's command loop. Every command, interrupt and question
goes through the node process: it writes the command to the worker's connection
(:class:`~nb_accel._messages.ToWorker`), turns the kernel's interrupt into a SIGINT there
(:class:`~nb_accel._messages.SignalWorker`) and reads the ranks' stacks and memory on its host
(:class:`~nb_accel._messages.AskWorkers`). The kernel names each rank's connection by the
number its node gave it, learnt from the rank's ``Started`` event. A rank that dies ends its
host's agent, which stops that host's ranks: the pool is then stopped, to be restarted.
"""

from __future__ import annotations

import itertools
import signal
import time
from typing import Any

from ..._messages import (
    AgentEnded,
    AgentRestarting,
    AskWorkers,
    Event,
    Forwarded,
    SignalWorker,
    Started,
    ToWorker,
    WorkersAnswer,
)
from ...errors import LaunchError
from ...worker.process.pool_worker import serve
from ...worker.transfer.pickling import Pickled
from ..failures.whereabouts import STACK_WAIT_S, RankStack, wait_per_round
from ..launchers.dispatch import TICK_S
from ..multinode.node_events import NodeHooks
from ..payload import launch_payload
from ..placement.hosts import HostPlan
from ..plan import LaunchPlan
from ..pool_ranks.interface import CellOutput, PoolRanks, RankStatus
from ..views.view import LaunchView, NullView
from .connections import GRACEFUL_STOP_S, HOST_STOP_GRACE_S, HostNodes, NodeChannel

__all__ = ["HostRanks", "start_host_ranks"]

#: How long a host may take to answer a question about its ranks, beyond their own wait.
ANSWER_SLACK_S = 5.0
#: The share of a bounded question's time (an interrupt's) that a host spends asking its
#: ranks; the rest is for its answer to arrive.
HOST_SHARE = 0.75


class HostRanks(NodeHooks, PoolRanks):
    """The ranks of a pool spread over ``hosts``, ``plan.num_processes`` on each.

    Args:
        plan: the pool's plan.
        hosts: the hosts and how they are reached.
        view: the launch view told of the ranks' events (a pool's is each command's).
        max_restarts: how many times the hosts' agents may restart the ranks (a pool's: none).
    """

    #: Less than a local pool's: stopping hosts' ranks takes longer (their agents end over the
    #: network), and an interrupt ends within 2 s all the same.
    interrupt_where_s = 0.6

    def __init__(
        self,
        plan: LaunchPlan,
        hosts: HostPlan,
        view: LaunchView | None = None,
        max_restarts: int = 0,
    ) -> None:
        self.output = CellOutput()
        NodeHooks.__init__(self, self.output, view or NullView(), max_restarts)
        self._plan = plan
        self._hosts = HostNodes(plan, hosts)
        per_host = plan.num_processes
        self.world_size = per_host * len(hosts.hosts)
        self.place_of = lambda rank: hosts.hosts[rank // per_host]
        self.done = {}
        self.cell = -1
        self._senders: dict[int, tuple[NodeChannel, int]] = {}  # rank -> its connection
        self._pids: dict[int, int] = {}
        self._answers: dict[int, dict[int, Any]] = {}
        self._requests = itertools.count()

    def start(self) -> None:
        """Start every host's node and wait until every rank has started."""
        payload = launch_payload(serve, (), {}, inherited=False, elsewhere=True)
        assert isinstance(payload, Pickled)
        self._hosts.start(payload.seal(None), max_restarts=0)  # a pool is not restarted
        while len(self._senders) < self.world_size:
            if self.dead_ranks():
                raise self.died(self.world_size, self._plan.timeout_s)
            self._pump(TICK_S)

    def started(self, event: Started, sender: Any) -> None:
        """Note which connection (of which host) ``event``'s rank speaks on."""
        super().started(event, sender)
        index, number = sender
        self._senders[event.rank] = (self._hosts.nodes[index], number)
        self._pids[event.rank] = event.pid

    def other(self, event: Event, sender: Any) -> None:
        """Keep the current command's replies."""
        self.take_reply(event)

    def _pump(self, timeout: float | None) -> None:
        """Handle what the hosts sent (waiting up to ``timeout`` for something)."""
        due = self.events.wake()
        if due is not None:
            timeout = due if timeout is None else min(timeout, due)
        for node in self._hosts.readable(timeout):
            held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:  # an interrupt must not land in the middle of a message
                messages = node.messages()
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, held)
            for message in messages:
                self._handle(node, message)

    def _handle(self, node: NodeChannel, message: Any) -> None:
        if isinstance(message, Forwarded):
            self.events.handle(node.event(message, self.place_of), (node.index, message.sender))
        elif isinstance(message, WorkersAnswer):
            self._answers[message.request] = message.value
        elif isinstance(message, AgentRestarting):  # a launch's ranks, restarted there
            per_host = self._plan.num_processes
            self.agent_restarting(node.index, message.attempt, message.died, per_host, node.host)
        elif isinstance(message, AgentEnded):
            reported = self.failures.ranks | set(self.done)
            for failure in self._hosts.deaths(node, reported, self.stderr_tail):
                self.failures.add(failure)

    def _node_of(self, rank: int) -> tuple[NodeChannel, int]:
        found = self._senders.get(rank)
        if found is None or not found[0].open:
            raise OSError(f"rank {rank} is not connected")
        return found

    def send(self, rank: int, data: bytes) -> None:
        """Through ``rank``'s host."""
        node, number = self._node_of(rank)
        node.tell(ToWorker(number, data))

    def interrupt(self, rank: int) -> None:
        """SIGINT to ``rank``, sent by its host."""
        node, number = self._node_of(rank)
        node.tell(SignalWorker(number, signal.SIGINT))

    def _ended(self, node: NodeChannel) -> bool:
        return not node.open or node.ended is not None

    def alive(self, rank: int) -> bool:
        """Whether ``rank``'s host still runs its ranks."""
        found = self._senders.get(rank)
        return found is not None and not self._ended(found[0])

    def note_exits(self) -> None:
        """Read what the hosts sent since the last command (a rank's death, say)."""
        self._pump(0.0)

    def dead_ranks(self) -> list[int]:
        """Every rank of a host whose ranks have ended (a rank's death ends its host's)."""
        per_host = self._plan.num_processes
        return [
            rank
            for node in self._hosts.nodes
            if self._ended(node)
            for rank in range(node.index * per_host, (node.index + 1) * per_host)
        ]

    def watch(self, view: LaunchView | None, timeout: float | None) -> None:
        """Wait for the hosts' messages (or ``timeout``) and handle them."""
        self.events.set_view(view)
        self._pump(timeout)

    def _ask(
        self, what: str, ranks: list[int], wait_s: float, within_s: float | None = None
    ) -> dict[int, Any]:
        """Ask each host ``what`` about its ranks among ``ranks`` (each rank given ``wait_s``
        a round); the answers by rank, those that came within ``within_s`` where given."""
        requests = []
        for node in self._hosts.nodes:
            senders = {
                rank: self._senders[rank][1]
                for rank in ranks
                if rank in self._senders and self._senders[rank][0] is node
            }
            if senders and not self._ended(node):
                request = next(self._requests)
                node.tell(AskWorkers(request, what, senders, wait_s))
                requests.append(request)
        if what == "abort":
            return {}
        waited = wait_s + ANSWER_SLACK_S if within_s is None else within_s
        deadline = time.monotonic() + waited
        while any(r not in self._answers for r in requests) and time.monotonic() < deadline:
            if self.dead_ranks():
                break
            self._pump(max(0.0, min(TICK_S, deadline - time.monotonic())))
        found: dict[int, Any] = {}
        for request in requests:
            found.update(self._answers.pop(request, {}))
        return found

    def stacks(
        self, ranks: list[int], collectives: bool, within_s: float | None = None
    ) -> dict[int, RankStack]:
        """Taken by each rank's host."""
        what = "where+collectives" if collectives else "where"
        if within_s is None:
            return self._ask(what, ranks, STACK_WAIT_S)
        # the host's rounds end in time for its answer to cross the link within the bound
        return self._ask(what, ranks, wait_per_round(within_s * HOST_SHARE), within_s)

    def out_of_reach(self, ranks: list[int]) -> dict[int, str]:
        """The ranks of a host whose connection ended before its agent said how it ended."""
        lost = {}
        for rank in ranks:
            found = self._senders.get(rank)
            node = found[0] if found is not None else None
            if node is not None and not node.open and node.ended is None:
                lost[rank] = f"was out of reach: {self._hosts.lost(node)}"
        return lost

    def frozen(self, ranks: list[int]) -> list[int]:
        """Those of ``ranks`` whose host sees their process stopped (SIGSTOP, Ctrl-Z)."""
        seen = self._ask("frozen", ranks, 0.0)
        return [rank for rank in ranks if seen.get(rank)]

    def abort_collectives(self, ranks: list[int]) -> None:
        """Through each rank's host."""
        self._ask("abort", ranks, 0.0)

    def status(self) -> list[RankStatus]:
        """Pid (on its host), liveness, device and memory of every rank."""
        memory = self._ask("memory", sorted(self._senders), 0.0)
        per_host = self._plan.num_processes
        device = self._plan.device
        return [
            RankStatus(
                rank=rank,
                pid=self._pids.get(rank, 0),
                alive=self.alive(rank),
                device=str(device.rank_device(rank % per_host)),
                memory_mb=memory.get(rank),
                host=self._hosts.hosts.hosts[rank // per_host],
            )
            for rank in range(self.world_size)
        ]

    def died(self, world_size: int, timeout_s: float) -> BaseException:
        """The ranks' failures, or what stopped a host."""
        if self.failures:
            return self.failures.exception(world_size, {}, timeout_s)
        for node in self._hosts.nodes:
            if self._ended(node):
                if node.ended is not None and not node.ended.problem:
                    return LaunchError(f"the ranks on host {node.host} ended")
                return LaunchError(self._hosts.problem(node))
        return LaunchError("the pool's ranks ended")

    def seal(self, pickled: Pickled) -> bytes:
        """Big buffers inside the bytes: the hosts cannot map this machine's memory."""
        return pickled.seal(None)

    def stop_hosts(self, grace_s: float) -> None:
        """Tell every host to stop, give them ``grace_s``, then cut their channels."""
        try:
            self._hosts.stop(grace_s)
        finally:
            self.events.close()  # its hooks are these ranks: a cycle otherwise

    def stop(self, graceful: bool = False) -> None:
        """Give the hosts time to end on their own (with ``graceful``), then stop them."""
        try:
            if graceful:
                deadline = time.monotonic() + GRACEFUL_STOP_S
                while any(n.open for n in self._hosts.nodes) and time.monotonic() < deadline:
                    self._pump(min(TICK_S, deadline - time.monotonic()))
            self._hosts.stop(HOST_STOP_GRACE_S)
        finally:
            self.events.close()  # its hooks are these ranks: a cycle otherwise


def start_host_ranks(plan: LaunchPlan, hosts: HostPlan) -> HostRanks:
    """Start a pool's ranks on ``hosts`` and wait until every one has started."""
    ranks = HostRanks(plan, hosts)
    try:
        ranks.start()
    except BaseException:
        ranks.stop()
        raise
    return ranks
