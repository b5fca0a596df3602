"""This node's ranks of a launch through torch's elastic agent, run by the one driver.

The agent is the engine that runs the ranks here: it meets the other nodes at the rendezvous,
starts this node's workers, watches them, restarts the whole group after a failure while
``max_restarts`` allows, and stops it after the last one. So the driver's first look at these
ranks (:meth:`NodeRanks.watch`) runs the agent to its end; the workers' events are heard
meanwhile on the listener's thread (:class:`~.node_events.NodeEvents`). Then every rank has
replied or is known dead, and the driver gives the outcome as for every other launch: the
results of this node's ranks, or the root cause with what each rank did. A rendezvous that
failed is the outcome when no rank failed, else a note on the failure it came after.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ..._messages import CellDone, Failure
from ..._openmp import release_openmp_threads
from ...errors import LaunchError
from ...worker.transfer.pickling import Pickled
from ..failures.failure_log import FailureLog
from ..failures.oom import oom_kills, oom_verdict
from ..failures.verdict import rank_list
from ..failures.whereabouts import RankStack, take_stacks
from ..launchers.outcome import FROZEN, RETURNED
from ..placement.nodes import NodePlan
from ..plan import LaunchPlan
from ..pool_ranks.interface import CellOutput, PoolRanks, RankStatus
from ..processes import process_frozen
from ..views.output import OutputPrinter
from ..views.view import LaunchView
from .node_events import NodeEvents
from .restarts import with_restarts, worker_deaths

__all__ = ["NodeRanks"]

_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
#: The longest the agent waits for the listener to record another node's failure (it runs
#: what it is given before it reads the next frames).
CAUSE_WAIT_S = 1.0


@contextlib.contextmanager
def _kernel_untouched() -> Iterator[None]:
    """Give back what the elastic agent changes in the calling process: its signal handlers
    and an environment variable (its loggers are quiet while it runs: see
    :mod:`.elastic_logs`)."""
    handlers = {name: signal.getsignal(getattr(signal, name)) for name in _SIGNALS}
    variable = os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE")
    try:
        yield
    finally:
        for name, handler in handlers.items():
            if handler is not None:
                signal.signal(getattr(signal, name), handler)
        if variable is None:
            os.environ.pop("TORCHELASTIC_SIGNALS_TO_HANDLE", None)
        else:
            os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = variable


def rendezvous_error(error: Exception, nodes: NodePlan, started: bool) -> LaunchError:
    """The error a rendezvous problem is raised as, saying what to do about it (``started``:
    the workers had started, so the rendezvous was reached before)."""
    name = type(error).__name__
    where = f"the rendezvous at {nodes.rdzv_endpoint}"
    detail = str(error).replace(" See inner exception for details.", "")  # none is attached
    if started:
        text = (
            f"node {nodes.node_rank} lost {where} while its workers ran ({detail}): node 0 "
            "(which hosts it) stopped or failed; see node 0's output for why"
        )
    elif "Timeout" in name:
        text = (
            f"not every node joined {where} within {nodes.rdzv_timeout:g} s (rdzv_timeout): run "
            f"the launch on all {nodes.num_nodes} nodes (node_rank 0 to {nodes.num_nodes - 1}), "
            "with the same num_nodes, num_processes, rdzv_endpoint and rdzv_id"
        )
    elif "Closed" in name:
        text = f"{where} was closed by another node (it stopped or failed): launch on all again"
    elif nodes.node_rank == 0:
        text = (
            f"node 0 could not host {where} ({detail}): rdzv_endpoint must be this machine's "
            "address and a free port"
        )
    else:
        text = (
            f"node {nodes.node_rank} could not reach {where} ({detail}): node 0's launch hosts "
            "it, so start that first (right after a failed launch, give node 0 a moment to "
            "finish), check the address, and make sure the port is open between the machines; "
            f"a node waits for it up to rdzv_timeout ({nodes.rdzv_timeout:g} s)"
        )
    return LaunchError(text)


class NodeRanks(PoolRanks):
    """This node's ranks, run by its elastic agent.

    Args:
        events: the listener of this node's workers (these ranks close it).
        printer: writes the workers' output; its view is the launch's.
        plan: what this node runs.
        nodes: the nodes of the launch.

    Attributes:
        agent_run: the agent's run, ready to start (returns its ``RunResult``); set once
            made.
    """

    keeps = False
    asked_where = False  # the agent stops them first (see stacks)
    finished_as = RETURNED

    def __init__(
        self,
        events: NodeEvents,
        printer: OutputPrinter,
        plan: LaunchPlan,
        nodes: NodePlan,
    ) -> None:
        self._node_events: NodeEvents | None = events
        self.events = events.events
        self.output = CellOutput()
        self.output.printer = printer
        self._plan = plan
        self._nodes = nodes
        self._oom_kills_at_start = oom_kills()  # what a worker's SIGKILL was is told by it
        self.agent_run: Callable[[], Any] | None = None
        per_node = plan.num_processes
        #: This node's ranks (their results are the launch's value here).
        self.targets = [nodes.node_rank * per_node + i for i in range(per_node)]
        self.cell = 0  # the function the ranks were started with
        self.done = {}
        self._ran = False
        self._agent_failures: dict[int, Any] = {}
        self._problem: LaunchError | None = None
        self._stopped_at: dict[int, RankStack] = {}
        self._frozen_at: list[int] = []
        self._located: list[int] = []
        #: Whether another node's ranks' failure was recorded here (see :meth:`locate`).
        self._told_cause = False
        self._last_events: NodeEvents | None = None

    def elsewhere(self) -> dict[int, str]:
        """The other nodes' ranks, each with its node: their own launch says where they were
        (a kernel sees only its own node's ranks)."""
        per_node = self._plan.num_processes
        every = range(self._nodes.num_nodes * per_node)
        return {
            rank: f"is on node {rank // per_node}, whose own launch says where it was"
            for rank in every
            if rank not in self.targets
        }

    def watch(self, view: LaunchView | None, timeout: float | None) -> None:
        """The first look runs the agent to its end (the workers' events are heard on the
        listener's thread meanwhile); then every rank has replied or is dead."""
        if self._ran:
            return
        self._ran = True
        run, self.agent_run = self.agent_run, None  # the agent's run holds the events
        if run is None:
            raise LaunchError("the launch's elastic agent was not made")
        interrupted = self._run_agent(run)
        if interrupted:  # raised here, so it keeps none of the agent's frames (and its store)
            raise KeyboardInterrupt

    def _run_agent(self, run: Callable[[], Any]) -> bool:
        """Run the agent; True when it was interrupted."""
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.rendezvous.api import RendezvousError

        try:
            if self._plan.start_method == "fork":
                release_openmp_threads()  # see nb_accel._openmp
            with _kernel_untouched():
                result = run()
            if result.is_failed():
                self._agent_failures = dict(result.failures)
                if not result.failures and not self._told_cause:  # another node ended it
                    self._problem = self._ended_elsewhere()  # (see NodeAgent), saying nothing
            del result
        except SignalException as stopped:
            if stopped.sigval != signal.SIGINT:
                raise
            return True
        except KeyboardInterrupt:  # while waiting for the rendezvous
            return True
        except LaunchError as problem:  # the nodes cannot meet: raised on every node at once
            self._problem = problem
        except RendezvousError as problem:
            started = self._node_events is not None and self._node_events.workers_started
            self._problem = rendezvous_error(problem, self._nodes, started)
        self._take_replies()
        return False

    def _take_replies(self) -> None:
        results = self.events.results
        for rank in self.targets:
            if rank in results:
                self.done[rank] = CellDone(rank, self.cell, value=results[rank])

    def dead_ranks(self) -> list[int]:
        """Once the agent has ended: this node's ranks without a result (how each ended is
        among the failures)."""
        return [rank for rank in self.targets if rank not in self.done] if self._ran else []

    def command_failures(
        self, targets: list[int], stopped: list[int], view: LaunchView | None
    ) -> FailureLog:
        """The last attempt's failures, on the launch's view all along."""
        return self.events.failures

    def hear_out(self) -> None:
        """Hear out the workers' connections, end the listener, and count the workers the
        agent saw die without reporting among the failures."""
        self.close_events()
        self._take_replies()
        if self._agent_failures:
            log = self.events.failures
            died = [(f.local_rank, f.pid, f.exitcode) for f in self._agent_failures.values()]
            reported = log.ranks | set(self.events.results) | log.stopped_ranks
            events = self._last_events
            tails = events.stderr_tail if events is not None else {}
            per_node = self._plan.num_processes
            oom_killed = oom_verdict(self._oom_kills_at_start)
            for record in worker_deaths(
                self._nodes.node_rank, died, per_node, reported, tails, oom_killed=oom_killed
            ):
                log.add(record)
            self._agent_failures = {}

    def close_events(self) -> None:
        """Stop listening for the workers (the agent has stopped them); once."""
        events, self._node_events = self._node_events, None
        self.agent_run = None
        if events is not None:
            self._last_events = events
            events.close()
            events.events.close()  # its hooks are the listener: a cycle otherwise

    def unexplained_end(self) -> BaseException | None:
        """The rendezvous' problem, or workers that ended without a result."""
        if self._problem is not None:
            return self._problem
        if not all(rank in self.events.results for rank in self.targets):
            return LaunchError("the workers ended without reporting a result")
        return None

    def died(self, world_size: int, timeout_s: float) -> BaseException:
        """The failures, else what :meth:`unexplained_end` says."""
        if self.events.failures:
            return self.events.failures.exception(world_size, {}, timeout_s)
        return self.unexplained_end() or LaunchError("the workers ended")

    def add_history(self, error: BaseException, failures: FailureLog) -> None:
        """What ended the attempts before the last; a rendezvous lost after the failure (while
        restarting after it)."""
        events = self._last_events or self._node_events
        if events is not None:
            with_restarts(error, events.restarts, failures)
        if self._problem is not None and hasattr(error, "add_note"):
            error.add_note(f"Restarting afterwards failed: {self._problem}")

    def send(self, rank: int, data: bytes) -> None:
        """Not possible: a launch's workers under the agent take no commands (their prompts
        are answered on the listener's thread)."""
        raise OSError("the workers of a launch under the elastic agent take no commands")

    def interrupt(self, rank: int) -> None:
        """Nothing: the agent stops the workers."""

    def alive(self, rank: int) -> bool:
        """Whether the agent has not ended yet."""
        return not self._ran

    def note_exits(self) -> None:
        """Nothing: the agent sees the workers end."""

    def locate(self, folder: str, running: dict[int, int], cause: Failure | None = None) -> None:
        """Where each of the ``running`` workers (pid by rank) is, taken before the agent
        stops them after its last failure (they answer in ``folder``), for the outcome; a
        frozen one (it cannot answer) is said to be. ``cause``: what another node's ranks
        recorded before their node ended the launch (their failure, or their collective
        timeout), recorded among the failures as theirs: the outcome then says it, and where
        the ranks here were, as one machine's launch does."""
        self._frozen_at = [rank for rank, pid in running.items() if process_frozen(pid)]
        awake = {rank: pid for rank, pid in running.items() if rank not in self._frozen_at}
        self._stopped_at = take_stacks(folder, awake, collectives=True)
        self._located = sorted(running)
        events = self._node_events
        if cause is not None and cause.rank not in self.targets and events is not None:
            recorded = threading.Event()

            def record() -> None:  # on the listener's thread, which owns the failures
                self.events.record_failure(cause)
                recorded.set()

            events.post(record)
            self._told_cause = recorded.wait(CAUSE_WAIT_S)

    def _ended_elsewhere(self) -> LaunchError:
        """The error of a launch that another node ended while ranks here still ran."""
        ranks = self._located or self.targets
        where = []
        for rank in ranks:
            if rank in self._frozen_at:
                where.append(f"rank {rank} {FROZEN}")
            elif rank in self._stopped_at:
                where.append(f"rank {rank} was {self._stopped_at[rank].summary()}")
        said = f" ({'; '.join(where)})" if where else ""
        return LaunchError(
            f"another node ended the launch while {rank_list(ranks)} here "
            f"{'was' if len(ranks) == 1 else 'were'} still running{said}: one of its ranks "
            "failed, or it was stopped. That node's own output says which; the ranks here "
            "were stopped, since the others will not come back to their collectives"
        )

    def frozen(self, ranks: list[int]) -> list[int]:
        """Those of ``ranks`` that were frozen when the agent stopped them (see
        :meth:`locate`)."""
        return [rank for rank in ranks if rank in self._frozen_at]

    def stacks(
        self, ranks: list[int], collectives: bool, within_s: float | None = None
    ) -> dict[int, RankStack]:
        """Where each of ``ranks`` was when the agent stopped it (the driver asks once the
        agent has ended)."""
        return {rank: self._stopped_at[rank] for rank in ranks if rank in self._stopped_at}

    def abort_collectives(self, ranks: list[int]) -> None:
        """Nothing: the agent stops the workers."""

    def status(self) -> list[RankStatus]:
        """None: a launch under the agent is not a pool."""
        return []

    def seal(self, pickled: Pickled) -> bytes:
        """Big buffers inside the bytes."""
        return pickled.seal(None)

    def stop(self, graceful: bool = False) -> None:
        """Stop listening (the agent has stopped the workers)."""
        self.close_events()
