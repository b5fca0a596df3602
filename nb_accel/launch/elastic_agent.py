"""One node's elastic agent: torch's ``LocalElasticAgent`` with a c10d rendezvous.

This does what ``torch.distributed.launcher.elastic_launch`` does with a ``LaunchConfig`` (the
rendezvous handler, the worker spec, the agent, the rendezvous shut down afterwards), with two
differences a notebook needs:

- the exit barrier (how long a node whose workers finished waits for the other nodes before
  leaving) is :data:`EXIT_BARRIER_S` instead of five minutes, so a node is not held for minutes
  when another node's rank fails after the last collective;
- the result is returned as the agent's ``RunResult`` (failures included) rather than raised,
  and nothing of the agent outlives the call: a later launch on the same port gets a fresh
  rendezvous store.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

__all__ = ["EXIT_BARRIER_S", "MONITOR_INTERVAL_S", "launch_config", "run_agent"]

#: How long a node whose workers have finished waits for the other nodes (seconds).
EXIT_BARRIER_S = 30.0
#: How often the agent looks at its workers (seconds).
MONITOR_INTERVAL_S = 0.05


def launch_config(
    num_nodes: int,
    node_rank: int,
    per_node: int,
    endpoint: str,
    backend: str,
    max_restarts: int,
    rdzv_timeout: float,
    start_method: str,
    log_dir: str,
) -> Any:
    """The ``LaunchConfig`` of one node: every node alike but for ``node_rank``; node 0 hosts
    the rendezvous store, the others only connect to it."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig

    wait_s = max(1, math.ceil(rdzv_timeout))
    return LaunchConfig(
        min_nodes=num_nodes,
        max_nodes=num_nodes,
        nproc_per_node=per_node,
        logs_specs=DefaultLogsSpecs(log_dir=log_dir),
        run_id="nb_accel",
        rdzv_endpoint=endpoint,
        rdzv_backend=backend,
        rdzv_configs={"join_timeout": wait_s, "read_timeout": wait_s, "is_host": node_rank == 0},
        max_restarts=max_restarts,
        monitor_interval=MONITOR_INTERVAL_S,
        start_method=start_method,
    )


def run_agent(
    config: Any, entrypoint: Callable[..., Any], args: tuple[Any, ...], hosts_store: bool
) -> Any:
    """Run this node's agent until its workers are done; the agent's ``RunResult``.

    After a failure the rendezvous is closed, so the other nodes' agents stop waiting for a
    restart; after a success only the node that hosts the store closes it (the others would
    find it gone already, and torch would print its connection errors).

    Raises what the rendezvous raises (``RendezvousError`` and its kinds) and the agent's
    ``SignalException`` when the process is told to stop.
    """
    from torch.distributed.elastic.agent.server.api import WorkerSpec
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.rendezvous import RendezvousParameters, registry

    parameters = RendezvousParameters(
        backend=config.rdzv_backend,
        endpoint=config.rdzv_endpoint,
        run_id=config.run_id,
        min_nodes=config.min_nodes,
        max_nodes=config.max_nodes,
        local_addr=config.local_addr,
        **config.rdzv_configs,
    )
    handler = registry.get_rendezvous_handler(parameters)
    spec = WorkerSpec(
        role=config.role,
        local_world_size=config.nproc_per_node,
        entrypoint=entrypoint,
        args=args,
        rdzv_handler=handler,
        max_restarts=config.max_restarts,
        monitor_interval=config.monitor_interval,
        local_addr=config.local_addr,
    )
    agent = LocalElasticAgent(
        spec=spec,
        logs_specs=config.logs_specs,
        start_method=config.start_method,
        exit_barrier_timeout=EXIT_BARRIER_S,
    )
    close_rendezvous = True
    try:
        result = agent.run()
        close_rendezvous = hosts_store or result.is_failed()
        return result
    except SignalException:
        close_rendezvous = False  # as torchrun: a stopped node leaves the rendezvous open
        raise
    finally:
        if close_rendezvous:
            handler.shutdown()
        del agent, spec, handler
