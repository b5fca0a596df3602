"""A launch through torch's elastic agent and its c10d rendezvous: over several machines, or
on this one when the workers are to be restarted after a failure (``max_restarts``).

Each node's kernel runs a :class:`NodesLauncher` (``notebook_launcher`` with ``num_nodes``
above 1) with the same ``num_nodes`` and ``rdzv_endpoint`` and its own ``node_rank``. The
elastic agent (``torch.distributed.launcher``'s ``elastic_launch``, the engine behind
``torchrun``) meets the other nodes at the rendezvous, starts this node's workers, watches them
and restarts the whole group after a failure while ``max_restarts`` allows. Node 0 hosts the
rendezvous store on the endpoint's port. Which address each node gives the others, and which
interface its workers' sockets use, is decided by
:class:`~nb_accel.launch.multinode.node_addresses.NodeNetwork`; nodes that could not meet stop
before any worker starts, all with the same message.

The workers talk back to their own kernel as on one machine (output, progress, the result or
the original exception), through :class:`~nb_accel.launch.multinode.node_events.NodeEvents`,
which the agent also tells of each restart and of the workers that died before it.

On one machine with ``max_restarts`` the launch is what ``torchrun --standalone`` runs: one
node, its rendezvous on a free port of the loopback interface.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import secrets
import shutil
import socket
from collections.abc import Callable
from typing import Any, ClassVar

from ..._messages import TrackerRun
from ...worker.debugging.awaiting import awaiting_pids
from ...worker.debugging.breakpoints import PROMPTS_VARIABLE
from ...worker.process.node_worker import NodeWorkerArgs, global_rank, node_worker_main
from ...worker.process.spec import Payload
from ...worker.transfer.segments import SHARE_DIR_ENV
from ..driver.driver import RankDriver
from ..launchers.backend import LaunchBackend
from ..launchers.outcome import load_result
from ..payload import sealed
from ..placement.nodes import NodePlan
from ..placement.short_commands import interrupt_deferred
from ..plan import LaunchPlan
from ..processes import multiprocessing_helpers
from ..request import LaunchCall
from ..scratch import make_scratch_dir
from ..spec import LaunchSpec
from ..workers import worker_env
from .elastic_agent import BeforeStop, OnRestart, launch_config, run_agent
from .node_addresses import NodeNetwork
from .node_events import NodeEvents, NodeView
from .node_ranks import NodeRanks

__all__ = ["NodesLauncher", "agent_run", "with_env"]

_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
_ELASTIC_LOGGERS = (
    "torch.distributed.elastic",
    "torch.distributed.launcher",
    "torch.multiprocessing",
)


def _on_this_machine(nodes: NodePlan) -> NodePlan:
    """``nodes`` of a launch on this machine alone: its rendezvous on a free port of the
    loopback interface, under a run id of its own (as ``torchrun --standalone``)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    run_id = f"{nodes.rdzv_id}-{secrets.token_hex(4)}"
    return dataclasses.replace(nodes, rdzv_endpoint=f"127.0.0.1:{port}", rdzv_id=run_id)


def agent_run(
    plan: LaunchPlan,
    nodes: NodePlan,
    address: str,
    authkey: bytes,
    payload: Payload,
    env: dict[str, str],
    log_dir: str,
    on_restart: OnRestart | None = None,
    before_stop: BeforeStop | None = None,
    on_exit_barrier: Callable[[], None] | None = None,
    sees_other_nodes: bool = False,
) -> Callable[[], Any]:
    """This node's agent run, ready to start: it meets the other nodes, then runs this node's
    workers, which report to ``address`` (authenticated with ``authkey``) and write their
    big results in ``log_dir``; ``on_restart`` is told of each restart of the workers,
    ``on_exit_barrier`` once they are done and the node waits for the others'; the call
    returns the agent's ``RunResult``. ``sees_other_nodes``: the kernel hears every node's
    workers and agents (a launch on hosts), and judges the launch whole; else each node's
    kernel sees only its own, and the nodes tell each other how theirs failed (see
    :func:`~nb_accel.launch.multinode.elastic_agent.run_agent`). A rank on hosts that raises
    waits there for the kernel's ``%debug`` (``plan.post_mortem_s``) unless the workers are
    restarted after a failure."""
    keeps = sees_other_nodes and nodes.max_restarts == 0 and plan.post_mortem_s > 0
    args = NodeWorkerArgs(
        address=address,
        authkey=authkey,
        node_rank=nodes.node_rank,
        num_nodes=nodes.num_nodes,
        backend=plan.backend,
        device_type=plan.device_type,
        timeout_s=plan.timeout_s,
        mixed_precision=plan.mixed_precision,
        payload=payload,
        env={**env, SHARE_DIR_ENV: log_dir},
        alone=not sees_other_nodes,
        post_mortem_s=plan.post_mortem_s if keeps else 0.0,
    )
    network = NodeNetwork(nodes.rdzv_endpoint or "", nodes.node_rank, plan.backend)
    config = launch_config(nodes, plan.num_processes, plan.start_method, log_dir, network.address)
    make_args = functools.partial(with_env, args)
    return functools.partial(
        run_agent,
        config,
        node_worker_main,
        make_args,
        nodes.node_rank == 0,
        network,
        on_restart,
        before_stop,
        on_exit_barrier,
        sees_other_nodes,
        functools.partial(awaiting_pids, log_dir) if keeps else None,
    )


def with_env(args: NodeWorkerArgs, extra: dict[str, str]) -> tuple[NodeWorkerArgs]:
    """The entrypoint's arguments: ``args`` with the variables ``extra`` added for the workers."""
    return (dataclasses.replace(args, env={**args.env, **extra}),)


def _tell_restart(
    events: NodeEvents, node_rank: int, per_node: int, attempt: int, died: list[Any]
) -> None:
    """The agent restarts the workers (on the thread that runs it): ``events`` hear of it on
    their own thread, before the new workers' first words."""
    events.post(functools.partial(events.agent_restarting, node_rank, attempt, died, per_node))


class NodesLauncher(LaunchBackend):
    """This node's share of a multi-node launch, through torch's elastic agent: the same call
    runs on every node's kernel, each with its own ``node_rank``. A launch on this machine
    alone whose workers are restarted after a failure runs here too, as one node."""

    name: ClassVar[str] = "nodes"

    @classmethod
    def runs(cls, spec: LaunchSpec) -> bool:
        """A launch of ``num_nodes`` above 1, or with ``max_restarts``, not driven over
        hosts."""
        nodes = spec.nodes
        return (
            spec.device.launcher is None
            and spec.hosts is None
            and (nodes.multi_node or nodes.max_restarts > 0)
        )

    def __init__(self, spec: LaunchSpec, call: LaunchCall) -> None:
        super().__init__(spec, call)
        self._plan = spec.plan
        self._nodes = spec.nodes
        self._ranks: NodeRanks | None = None
        self._log_dir: str | None = None
        self._left_open: list[TrackerRun] = []
        self._helpers = contextlib.ExitStack()

    def start(self) -> None:
        """Listen for this node's workers and make the agent's configuration; the workers
        start once the nodes meet (in :meth:`wait`)."""
        plan, nodes = self._plan, self._nodes
        if not nodes.multi_node:
            self._nodes = nodes = _on_this_machine(nodes)
        self._helpers.enter_context(multiprocessing_helpers(plan.start_method))
        authkey = secrets.token_bytes(32)
        first = global_rank(nodes.node_rank, 0, plan.num_processes)
        node_view = NodeView(self.view, first, plan.num_processes)
        with interrupt_deferred():  # the events' threads are the ranks' to stop once started
            events = NodeEvents(self.printer, node_view, authkey, nodes.max_restarts)
            self._ranks = ranks = NodeRanks(events, self.printer, plan, nodes)
        self._log_dir = make_scratch_dir("nodes")
        payload = sealed(self.payload, self._log_dir)  # big buffers in this node's folder
        # the kernel answers their prompts (input(), breakpoints), on the events' thread
        env = {**worker_env(plan, single_node=not nodes.multi_node), PROMPTS_VARIABLE: "1"}
        on_restart = functools.partial(_tell_restart, events, nodes.node_rank, plan.num_processes)
        located = functools.partial(ranks.locate, self._log_dir)
        ranks.agent_run = agent_run(
            plan, nodes, events.address, authkey, payload, env, self._log_dir, on_restart, located
        )

    def wait(self) -> list[Any] | BaseException:
        """Meet the other nodes, run this node's workers (restarting the group while
        ``max_restarts`` allows) and return their results or the exception to raise (a
        worker's own, or a :class:`LaunchError` for the rendezvous): the agent runs them, the
        one driver gives the outcome, as for every launch."""
        assert self._ranks is not None, "start() first"
        plan, nodes = self._plan, self._nodes
        driver = RankDriver(
            self._ranks,
            plan.num_processes * nodes.num_nodes,
            plan.timeout_s,
            plan.device.detached_collectives(plan.backend),
            give_up=lambda why: None,  # the agent stops this node's ranks after it
        )
        try:
            outcome = driver.run_started(self.view, self._ranks.targets)
        finally:
            self.stop()  # every event heard before the outcome is made
        if isinstance(outcome, BaseException):
            return outcome
        return [load_result(rank, reply.value or b"") for rank, reply in sorted(outcome.items())]

    def runs_left_open(self) -> list[TrackerRun]:
        """The tracker runs this node's ranks opened and were not heard ending (the other
        nodes' kernels end theirs)."""
        return list(self._left_open)

    def stop(self, graceful: bool = False) -> None:
        """Stop listening for the workers (the elastic agent has stopped them) and remove
        the agent's scratch folder."""
        ranks = self._ranks
        if ranks is not None:
            ranks.close_events()
            self._left_open = list(ranks.events.open_runs.values())
        if self._log_dir is not None:
            shutil.rmtree(self._log_dir, ignore_errors=True)
            self._log_dir = None
        self._helpers.close()
