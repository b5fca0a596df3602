"""One node's elastic agent: torch's ``LocalElasticAgent`` with a c10d rendezvous.

This does what ``torch.distributed.launcher.elastic_launch`` does with a ``LaunchConfig`` (the
rendezvous handler, the worker spec, the agent, the rendezvous shut down afterwards), with the
differences a notebook needs:

- the exit barrier (how long a node whose workers finished waits for the other nodes before
  leaving) is :data:`EXIT_BARRIER_S` instead of five minutes, and a node whose run failed
  checks in there as it leaves (:mod:`.exit_barrier`), so a node is not held when another
  node's rank fails after the last collective;
- the result is returned as the agent's ``RunResult`` (failures included) rather than raised,
  and nothing of the agent outlives the call: a later launch on the same port gets a fresh
  rendezvous store;
- right after each rendezvous, before any worker starts, the nodes meet through the
  rendezvous store (:mod:`.node_meeting`): a node that could not meet the others (a loopback
  address for another machine) says why, every node stops with that message, and otherwise
  the workers get the interface for their sockets;
- a worker that raised and waits for the kernel's ``%debug`` (a launch on hosts) is left
  running when the others fail: the run ends once it does;
- the rendezvous store and the store the workers share listen on one address each (the
  interface the other nodes reach), not on every address of the machine.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import signal
from collections.abc import Callable
from typing import Any

from ..._messages import Failure
from ...errors import LaunchError
from ...runtime.device_types.cuda_facts import fork_safe_cuda_queries
from ...worker.transfer.segments import SHM_ROOT
from ..placement.nodes import NodePlan
from .elastic_logs import quiet_elastic_logs
from .exit_barrier import check_out
from .failure_relay import (
    keep_store_for_readers,
    launch_ranks,
    recorded_cause,
    relay_signal_deaths,
)
from .node_addresses import NodeNetwork
from .node_meeting import meet
from .rendezvous_pace import brisk_rendezvous
from .rendezvous_stores import rendezvous_handler
from .unanswered import (
    END_WAIT_S,
    INTERRUPTED_END_S,
    RendezvousWatch,
    heard_out,
)
from .unreaped import (
    child_pids,
    continue_children,
    ended_unreaped,
    reap_started_since,
    stop_children,
)

__all__ = ["EXIT_BARRIER_S", "BeforeStop", "OnRestart", "launch_config", "run_agent"]

#: Told, as the agent restarts its workers, the attempt they start (``TORCHELASTIC_RESTART_COUNT``)
#: and the workers of the attempt before that ended, as ``(local rank, pid, exit code)``.
OnRestart = Callable[[int, list[tuple[int, int, int]]], None]
#: Told, when the agent is about to stop its workers after the failure it will not restart
#: them for, the workers still running then: their process ids by global rank (so that the
#: kernel can say where each was); and, when another node ended the launch, what its ranks
#: recorded in the workers' store (their failure or timeout; ``None``: nothing).
BeforeStop = Callable[[dict[int, int], Failure | None], None]

#: How long a node whose workers have finished waits for the other nodes (seconds).
EXIT_BARRIER_S = 30.0


def launch_config(
    nodes: NodePlan, per_node: int, start_method: str, log_dir: str, local_addr: str | None = None
) -> Any:
    """The ``LaunchConfig`` of one node of ``nodes``, running ``per_node`` workers: every node
    alike but for its ``node_rank``; node 0 hosts the rendezvous store, the others only connect
    to it. ``local_addr`` is the address this node advertises (``None``: torch's choice, its
    host name). The user's ``rdzv_conf`` is set over the timeouts that ``rdzv_timeout`` gives;
    the run id must be the same on every node; ``monitor_interval`` is how often the agent
    looks at its workers (seconds)."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig

    wait_s = max(1, math.ceil(nodes.rdzv_timeout))
    with fork_safe_cuda_queries():  # it asks whether CUDA is there, in this kernel
        return LaunchConfig(
            min_nodes=nodes.num_nodes,
            max_nodes=nodes.num_nodes,
            nproc_per_node=per_node,
            logs_specs=DefaultLogsSpecs(log_dir=log_dir),
            run_id=nodes.rdzv_id,
            rdzv_endpoint=nodes.rdzv_endpoint or "",
            rdzv_backend=nodes.rdzv_backend,
            rdzv_configs={
                "join_timeout": wait_s,
                "read_timeout": wait_s,
                "is_host": nodes.node_rank == 0,
                **nodes.rdzv_conf,
            },
            max_restarts=nodes.max_restarts,
            monitor_interval=nodes.monitor_interval,
            start_method=start_method,
            local_addr=local_addr,
        )


def _agent_class() -> type:
    """torch's ``LocalElasticAgent``, meeting the other nodes after each rendezvous."""
    import torch
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    if not hasattr(LocalElasticAgent, "_rendezvous"):  # the agent's own step overridden below
        raise LaunchError(
            f"torch {torch.__version__} has no SimpleElasticAgent._rendezvous, after which each "
            "node's elastic agent meets the other nodes: a launch on several nodes needs a "
            "torch whose elastic agent has it, as torch 2.13 and the releases before it do"
        )

    class NodeAgent(LocalElasticAgent):  # type: ignore[misc]
        """A ``LocalElasticAgent`` that runs :func:`.meet` after each rendezvous and says
        when it restarts its workers, and why (``on_restart``)."""

        def __init__(
            self,
            network: NodeNetwork,
            make_args: Callable[[dict[str, str]], tuple[Any, ...]],
            wait_s: float,
            on_restart: OnRestart | None,
            before_stop: BeforeStop | None = None,
            on_exit_barrier: Callable[[], None] | None = None,
            awaiting: Callable[[], set[int]] | None = None,
            **options: Any,
        ) -> None:
            super().__init__(**options)
            self._on_exit_barrier = on_exit_barrier
            self._awaiting = awaiting
            self._network = network
            self._make_args = make_args
            self._wait_s = wait_s
            self._on_restart = on_restart
            self._before_stop = before_stop
            self._ended: list[tuple[int, int, int]] = []
            self._rounds = 0
            self._worker_pids: list[int] = []
            self._attempt = 0
            self._stopping = False
            self._group: Any = None
            #: The rendezvous, watched in the background (set before the run).
            self.watch: RendezvousWatch | None = None
            #: Whether this node's kernel sees only this node's workers (not a launch on
            #: hosts): the nodes then tell each other how theirs failed, and a node sees
            #: another end the launch (set before the run).
            self.alone = True
            self._relayed: set[tuple[int, int]] = set()

        def _invoke_run(self, role: str = "default") -> Any:
            """torch's run; a run that failed then checks this node in at the exit barrier
            (:meth:`_check_out`)."""
            result = super()._invoke_run(role)
            if result.is_failed():
                self._check_out()
            return result

        def _check_out(self) -> None:
            """Count this node as done at the exit barrier (see :mod:`.exit_barrier`)."""
            store, group = self._store, self.get_worker_group()
            if store is not None and group.group_world_size is not None:  # a rendezvous made
                check_out(store, group.group_world_size)

        def _exit_barrier(self) -> None:
            """Say that this node's workers are done (``on_exit_barrier``), then wait for the
            other nodes' as torch does: a wait no signal ends (it is in the store's code)."""
            if self._on_exit_barrier is not None:
                self._on_exit_barrier()
            super()._exit_barrier()

        def _shutdown(
            self, death_sig: signal.Signals = signal.SIGTERM, *args: Any, **kwargs: Any
        ) -> None:
            """Stop the workers as every launch stops its ranks (SIGTERM, with SIGCONT for a
            frozen one; a short grace; SIGKILL) before torch's own stop, which gives a worker
            that does not act on SIGTERM (frozen, or blocked in a collective's native code)
            its whole grace (30 s) before its SIGKILL. Another signal (the node's interrupt)
            is torch's to pass on, with its grace: a frozen worker is continued to take it."""
            self._stopping = True  # the deaths from now on are this stop's
            if death_sig == signal.SIGTERM:
                stop_children(self._worker_pids)
            else:
                continue_children(self._worker_pids)
            super()._shutdown(death_sig, *args, **kwargs)

        def _start_workers(self, worker_group: Any) -> Any:
            """torch's start; a start that did not finish (the kernel's interrupt, a stop)
            leaves none of the workers it started (see :func:`.unreaped.reap_started_since`)."""
            before = child_pids()
            try:
                return super()._start_workers(worker_group)
            except BaseException:
                reap_started_since(before)
                raise

        def _rendezvous(self, worker_group: Any) -> None:
            """torch's round, then :func:`.meet`: each on a thread of its own, waited for
            here in short steps, where the user's interrupt is heard even while a store that
            does not answer holds the round (see :func:`~.unanswered.heard_out`)."""
            watch = self.watch
            round_of_torch = super()._rendezvous
            with watch.quiet() if watch is not None else contextlib.nullcontext():
                heard_out(lambda: round_of_torch(worker_group))
            self._group = worker_group
            self._rounds += 1
            network, make_args, wait_s, rounds = (
                self._network,
                self._make_args,
                self._wait_s,
                self._rounds,
            )
            self._attempt = heard_out(
                lambda: meet(worker_group, network, make_args, wait_s, rounds)
            )
            self._stopping = False

        def _monitor_workers(self, worker_group: Any) -> Any:
            self._worker_pids = [w.id for w in worker_group.workers if isinstance(w.id, int)]
            if self._before_stop is not None and self._remaining_restarts <= 0:
                self._before_last_stop(worker_group)
            self._continue_frozen(worker_group)
            if self._held_for_debugger(worker_group):  # not looked at: torch would stop it
                from torch.distributed.elastic.agent.server.api import RunResult, WorkerState

                if self.watch is not None:
                    self.watch.silence()  # the other nodes have gone, their store with them
                return RunResult(state=WorkerState.HEALTHY)  # looked at once that worker ends
            result = super()._monitor_workers(worker_group)
            if self._ended_elsewhere(worker_group, result):
                from torch.distributed.elastic.agent.server.api import RunResult, WorkerState

                return RunResult(state=WorkerState.FAILED)  # without a failure of its own
            self._ended = [
                (failure.local_rank, failure.pid, failure.exitcode)
                for failure in result.failures.values()
            ]
            if self.alone and not self._stopping:
                self._relay_deaths(worker_group, result.failures)
            return result

        def _held_for_debugger(self, worker_group: Any) -> bool:
            """Whether the workers are left as they are, not looked at, because one of them
            raised and waits for the kernel's ``%debug`` (``awaiting``: the pids of those
            that do), with no restart left: torch's look at workers one of which failed
            stops the others, that one with them."""
            if self._awaiting is None or self._remaining_restarts > 0:
                return False
            marked = self._awaiting()
            pids = [w.id for w in worker_group.workers if isinstance(w.id, int) and w.id in marked]
            return any(ended_unreaped(pid) is None for pid in pids)

        def keep_store_for_readers(self) -> None:
            """After the run failed: see :func:`failure_relay.keep_store_for_readers`."""
            if self._group is not None:
                keep_store_for_readers(self._group, self._attempt)

        def _relay_deaths(self, worker_group: Any, failures: dict[int, Any]) -> None:
            """See :func:`failure_relay.relay_signal_deaths`."""
            node_rank, attempt = self._network.node_rank, self._attempt
            relay_signal_deaths(worker_group, failures, node_rank, attempt, self._relayed)

        def _ended_elsewhere(self, worker_group: Any, result: Any) -> bool:
            """Whether another node closed the rendezvous (its ranks failed, or it was
            stopped) while the workers here still run: they would wait for it in their own
            code, or frozen, forever. ``before_stop`` is told where they are first."""
            from torch.distributed.elastic.agent.server.api import WorkerState

            closed = self.alone and self.watch is not None and self.watch.closed
            if not closed or result.state != WorkerState.HEALTHY:
                return False
            if self._before_stop is not None:
                running = launch_ranks(worker_group, self._network.node_rank)
                cause = recorded_cause(worker_group, self._attempt)
                before_stop, self._before_stop = self._before_stop, None  # once
                before_stop(running, cause)
            return True

        def _before_last_stop(self, worker_group: Any) -> None:
            """Once a worker has failed and no restart is left, tell ``before_stop`` of the
            workers still running, before the agent's look at them stops them (the failed
            worker is looked at without being reaped: the agent still sees it end)."""
            running: dict[int, int] = {}
            failed = False
            ranks = {
                pid: rank
                for rank, pid in launch_ranks(worker_group, self._network.node_rank).items()
            }
            for worker in worker_group.workers:
                if not isinstance(worker.id, int):
                    return  # not started yet
                ended = ended_unreaped(worker.id)
                if ended is None:
                    running[ranks[worker.id]] = worker.id
                else:
                    failed = failed or ended
            if failed and running and self._before_stop is not None:
                before_stop, self._before_stop = self._before_stop, None  # once
                before_stop(running, None)

        def _continue_frozen(self, worker_group: Any) -> None:
            """Once a worker has failed, continue the workers that are stopped (frozen): torch
            stops the others with SIGTERM, which a stopped process acts on only once
            continued; it would otherwise hold the restart, or the end, for torch's whole
            grace (30 s) before its SIGKILL."""
            workers = [w for w in worker_group.workers if isinstance(w.id, int)]
            if not any(ended_unreaped(worker.id) for worker in workers):
                return
            continue_children([worker.id for worker in workers])

        def _restart_workers(self, worker_group: Any) -> None:
            if self._on_restart is not None:
                spec = worker_group.spec
                self._on_restart(spec.max_restarts - self._remaining_restarts, self._ended)
            super()._restart_workers(worker_group)

    return NodeAgent


@quiet_elastic_logs()
def run_agent(
    config: Any,
    entrypoint: Callable[..., Any],
    make_args: Callable[[dict[str, str]], tuple[Any, ...]],
    hosts_store: bool,
    network: NodeNetwork,
    on_restart: OnRestart | None = None,
    before_stop: BeforeStop | None = None,
    on_exit_barrier: Callable[[], None] | None = None,
    sees_other_nodes: bool = False,
    awaiting: Callable[[], set[int]] | None = None,
) -> Any:
    """Run this node's agent until its workers are done; the agent's ``RunResult``.

    ``make_args(env)`` gives the entrypoint's arguments with ``env`` (variables for the
    workers, chosen after the rendezvous) added to them; ``on_restart`` is told of each
    restart of the workers (see :data:`OnRestart`); ``before_stop`` of the workers still
    running when the agent stops them after its last failure (see :data:`BeforeStop`);
    ``on_exit_barrier`` once this node's workers are done and it waits for the other nodes';
    ``awaiting`` gives the pids of the workers that wait for ``%debug``: one that still runs
    when the others failed is left running, the run ending once it ends.
    Unless ``sees_other_nodes`` (a launch on hosts, whose kernel hears every node), this
    node's kernel sees only its own workers: the agent records how a worker here died by a
    signal for the other nodes' ranks, keeps the workers' store it hosts until they read a
    failure there (:mod:`failure_relay`), and stops its workers when another node ended the
    launch (the run's result is then a failure without failures of its own).

    After a failure the rendezvous is closed, so the other nodes' agents stop waiting for a
    restart; after a success only the node that hosts the store closes it (the others would
    find it gone already, and torch would print its connection errors).

    Raises what the rendezvous raises (``RendezvousError`` and its kinds), a
    :class:`LaunchError` when the nodes cannot meet (see :func:`.meet`), and the agent's
    ``SignalException`` when the process is told to stop.
    """
    from torch.distributed.elastic.agent.server.api import WorkerSpec
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.rendezvous import RendezvousParameters

    parameters = RendezvousParameters(
        backend=config.rdzv_backend,
        endpoint=config.rdzv_endpoint,
        run_id=config.run_id,
        min_nodes=config.min_nodes,
        max_nodes=config.max_nodes,
        local_addr=config.local_addr,
        **config.rdzv_configs,
    )
    handler = rendezvous_handler(parameters, hosts_store)
    spec = WorkerSpec(
        role=config.role,
        local_world_size=config.nproc_per_node,
        entrypoint=entrypoint,
        args=make_args({}),
        rdzv_handler=handler,
        max_restarts=config.max_restarts,
        monitor_interval=config.monitor_interval,
        local_addr=config.local_addr,
    )
    agent = _agent_class()(
        network,
        make_args,
        float(config.rdzv_configs["read_timeout"]),
        on_restart,
        before_stop,
        on_exit_barrier,
        awaiting,
        spec=spec,
        logs_specs=config.logs_specs,
        start_method=config.start_method,
        exit_barrier_timeout=EXIT_BARRIER_S,
    )
    agent.alone = not sees_other_nodes
    close_rendezvous = True
    watching = True
    end_wait_s = END_WAIT_S
    watch = RendezvousWatch(handler, config.monitor_interval)
    handler.num_nodes_waiting = watch  # the agent's loop never waits for the store
    agent.watch = watch
    watch.start()
    try:
        with brisk_rendezvous(handler, config.max_nodes):
            result = agent.run()
        close_rendezvous = hosts_store or result.is_failed()
        if result.is_failed() and agent.alone:
            # The other nodes learn of the end from the closed rendezvous: closed first, so
            # that they still find this attempt's failure in the workers' store, which this
            # node may host and keeps for them only a few seconds.
            watch.end(end_wait_s, handler.shutdown)  # not a word to the store while it closes
            watching = close_rendezvous = False
            agent.keep_store_for_readers()
        return result
    except SignalException:
        close_rendezvous = False  # as torchrun: a stopped node leaves the rendezvous open
        raise
    except KeyboardInterrupt:  # its user's stop: the cell ends at once
        end_wait_s = INTERRUPTED_END_S
        raise
    except OSError as problem:
        if problem.errno != errno.ENOSPC:
            raise
        said = _no_space(problem)
    finally:
        if watching:  # (a question in flight to a store cut off is waited for once)
            watch.end(end_wait_s, handler.shutdown if close_rendezvous else None)
        del handler.num_nodes_waiting  # the watch holds the handler: no cycle is left
        del agent, spec, handler, watch
    # raised here, without the OSError's frames: they hold the agent, its stores and their
    # connections, for as long as the error is kept (a notebook keeps the last one)
    raise LaunchError(said)


def _no_space(problem: OSError) -> str:
    """What a full file system that stopped the agent starting its workers means, in words:
    Python's multiprocessing makes each worker's queue's locks in ``/dev/shm``."""
    try:
        stats = os.statvfs(SHM_ROOT)
        free, size = stats.f_bavail * stats.f_frsize, stats.f_blocks * stats.f_frsize
    except OSError:
        return f"the elastic agent could not start the workers: {problem}"
    return (
        f"the elastic agent could not start the workers: {problem}. Its workers' queues need "
        f"room in {SHM_ROOT} ({free >> 20} MB free of {size >> 20} MB): remove what fills it "
        "(leftover files, another program's shared memory), or make it bigger (a container's "
        "--shm-size)"
    )
