"""A launch's ranks across hosts: each host's node process runs torch's elastic agent for its
ranks, started with the launch's function (their one command), and forwards their events.

They are the hosts' ranks as a pool's are (:class:`~.pool_ranks.HostRanks`), run by the same
driver (:mod:`~nb_accel.launch.driver.driver`). What differs is said here: a rank replies with
its result or failure; the agents may restart the ranks after a failure (``max_restarts``),
and until the last attempt a failure is not the outcome; the failures' window is longer, as
reports come through each host's node (and a worker's death is known once its host's agent
noticed it); once the outcome is known every host is told to stop and heard out. In a
notebook, the rank that raised is kept for ``%debug`` (see :mod:`.held_rank`): its host is
left running, its other ranks ended by their own failure.
"""

from __future__ import annotations

import time
from typing import Any

from ..._messages import Failure, Result, Started, StopNode
from ...errors import LaunchError
from ..debugging.kept_rank import KeptRank, waiting_note
from ..debugging.post_mortems import in_ipython, offer_post_mortem, raising_ranks
from ..failures.failure_log import EXPLAIN_WINDOW_S, FailureLog
from ..launchers.dispatch import TICK_S
from ..launchers.outcome import RETURNED
from ..multinode.elastic_agent import EXIT_BARRIER_S
from ..multinode.restarts import with_restarts
from ..placement.hosts import HostPlan
from ..plan import LaunchPlan
from ..pool_ranks.interface import reply_of_outcome
from ..views.output import OutputPrinter
from ..views.view import LaunchView
from .connections import GRACEFUL_STOP_S, NodeChannel
from .held_rank import HeldOnHost
from .pool_ranks import HostRanks

__all__ = ["AGENT_STOP_S", "HOSTS_COLLECT_WINDOW_S", "HOSTS_EXPLAIN_WINDOW_S", "LaunchedHostRanks"]

#: How long a host told to stop may take to end: its agent stops its workers as every launch
#: does (SIGTERM, a short grace, SIGKILL), then its node process says how the agent ended.
AGENT_STOP_S = 5.0
#: After the first failure, how long to keep listening for the other ranks' reports: longer
#: than on one machine (:data:`~nb_accel.launch.failures.failure_log.COLLECT_WINDOW_S`), as
#: they come through each host's node.
HOSTS_COLLECT_WINDOW_S = 0.5
#: The same while every failure so far looks like a consequence (a lost connection): the
#: cause may still be on its way (a worker's death is known once its host's agent noticed it).
HOSTS_EXPLAIN_WINDOW_S = 5.0


class LaunchedHostRanks(HostRanks):
    """The ranks of one launch across ``hosts``, ``plan.num_processes`` on each.

    Args:
        plan: the launch's plan.
        hosts: the hosts and how they are reached.
        printer: writes the workers' output; its view is the launch's.
    """

    keeps = False
    finished_as = RETURNED

    def __init__(self, plan: LaunchPlan, hosts: HostPlan, printer: OutputPrinter) -> None:
        super().__init__(plan, hosts, printer.view, hosts.agent.max_restarts)
        self.output.printer = printer
        self._max_restarts = hosts.agent.max_restarts
        self.cell = 0  # the function the ranks were started with
        #: How long the rank that raised waits for ``%debug`` (its agent would restart it
        #: instead where restarts are allowed).
        self._post_mortem_s = plan.post_mortem_s if self._max_restarts == 0 else 0.0
        #: The rank whose host is left running after the failure, for ``%debug``.
        self._spared: int | None = None
        #: That rank, once kept.
        self._kept: KeptRank | None = None

    def start_with(self, payload: bytes) -> None:
        """Start every host's node process, check their versions, and send each its job:
        ``payload`` (the pickled call) on its ranks."""
        self._hosts.start(payload)

    def started(self, event: Started, sender: Any) -> None:
        """A rank started; one of a newer attempt (the agents restarted the ranks) starts the
        command afresh."""
        newer = event.attempt > self.attempt
        super().started(event, sender)
        if newer:
            self.done = {}

    def ended(self, event: Result | Failure) -> None:
        """A rank's reply to its command: its result, or its failure (a failure another rank
        relays for it counts as its reply too, as its first)."""
        reply_of_outcome(self.done, self.cell, event)

    def dead_ranks(self) -> list[int]:
        """The ranks of a host whose agent ended (or whose channel did) without a reply."""
        return [rank for rank in super().dead_ranks() if rank not in self.done]

    def restarting(self) -> bool:
        """Whether the agents will restart the ranks after this attempt's failures: attempts
        are left, no host is broken, and some host still runs."""
        nodes = self._hosts.nodes
        return (
            self.attempt < self._max_restarts
            and not self._hosts.broken()
            and any(node.open and node.ended is None for node in nodes)
        )

    def collect_window(self, targets: list[int], dead: list[int]) -> float:
        """:data:`HOSTS_COLLECT_WINDOW_S` once a cause is known or a host broke; while every
        failure is a collective's timeout, the window one machine gives
        (:data:`~nb_accel.launch.failures.failure_log.EXPLAIN_WINDOW_S`: a rank that never
        arrived is located by the outcome, and a death that made others wait was reported
        by its host's agent long before their timeout); else :data:`HOSTS_EXPLAIN_WINDOW_S`."""
        failures = self.failures
        if failures.has_cause or self._hosts.broken():
            return HOSTS_COLLECT_WINDOW_S
        if failures.ranks <= failures.timeout_ranks:
            return EXPLAIN_WINDOW_S
        return HOSTS_EXPLAIN_WINDOW_S

    def command_failures(
        self, targets: list[int], stopped: list[int], view: LaunchView | None
    ) -> FailureLog:
        """This attempt's failures as they arrived, on the launch's view all along."""
        return self.failures

    def hear_out(self) -> None:
        """Read until every host has ended: on its own once every rank returned (its agent
        waits for the other hosts' first, up to ``EXIT_BARRIER_S``), else told to stop now
        (its agent gives its workers up to :data:`AGENT_STOP_S` to end); the deaths each
        agent saw join the failures. A host that has not ended :data:`GRACEFUL_STOP_S` after
        that is cut off by the stop."""
        nodes = self._hosts.nodes
        spared = None
        if all(r in self.done and not self.done[r].failure for r in range(self.world_size)):
            wait_s = EXIT_BARRIER_S + GRACEFUL_STOP_S
        else:
            wait_s = AGENT_STOP_S + GRACEFUL_STOP_S
            spared = self._spared_node()
            for node in nodes:
                if node.open and node.ended is None and node is not spared:
                    node.tell(StopNode())
        heard = [node for node in nodes if node is not spared]
        deadline = time.monotonic() + wait_s
        while any(node.open for node in heard) and time.monotonic() < deadline:
            self._pump(min(TICK_S, max(0.0, deadline - time.monotonic())))
        self.output.printer.flush()

    def _spared_node(self) -> NodeChannel | None:
        """The host of the rank that raised first, left running for ``%debug`` (that rank
        waits there, the host's other ranks ended by their failure), where the launch keeps
        one and that host still runs."""
        ranks = raising_ranks(self.failures) if self._post_mortem_s > 0 else []
        found = self._senders.get(ranks[0]) if ranks else None
        if found is None or found[0].ended is not None or not found[0].open:
            return None
        self._spared = ranks[0]
        return found[0]

    def keep_for_debugging(self, error: BaseException, ranks: list[int]) -> None:
        """Keep the first of ``ranks`` (the root cause's) waiting for ``%debug`` on its host,
        left running for it (see :meth:`_spared_node`); the other hosts stop as usual."""
        rank = self._spared
        if rank is None or not ranks or ranks[0] != rank or rank not in self._senders:
            self._spared = None
            return
        node, number = self._senders[rank]
        held = HeldOnHost(self._hosts, node, number, rank, self.place_of)
        kept = self._kept = KeptRank(held, self._post_mortem_s)
        offer_post_mortem(error, [rank], kept.debug, kept)
        if in_ipython() and hasattr(error, "add_note"):
            error.add_note(waiting_note(rank, self._post_mortem_s))
        kept.let_go_unless_raised(error)

    def stop_hosts(self, grace_s: float) -> None:
        """Tell every host to stop, give them ``grace_s``, then cut their channels; the host
        of a rank kept for ``%debug`` is left to it."""
        if self._kept is None or self._spared is None:
            super().stop_hosts(grace_s)
            return
        try:
            self._hosts.stop(grace_s, keep=self._senders[self._spared][0])
        finally:
            self.events.close()  # its hooks are these ranks: a cycle otherwise

    def died(self, world_size: int, timeout_s: float) -> BaseException:
        """The failures, else what :meth:`unexplained_end` says."""
        if self.failures:
            return self.failures.exception(world_size, {}, timeout_s)
        return self.unexplained_end() or LaunchError("the workers ended without reporting a result")

    def unexplained_end(self) -> BaseException | None:
        """A host that ended on a problem (or has not ended), when no rank failed."""
        nodes = self._hosts.nodes
        problems = [node for node in nodes if node.ended is None or node.ended.problem]
        if problems:
            return LaunchError(self._hosts.problem(problems[0]))
        if not all(rank in self.done for rank in range(self.world_size)):
            return LaunchError("the workers ended without reporting a result")
        return None

    def add_history(self, error: BaseException, failures: FailureLog) -> None:
        """The restarts before the last attempt, and what caused each."""
        with_restarts(error, self.restarts, failures)
