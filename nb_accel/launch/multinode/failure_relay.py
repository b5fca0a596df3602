"""How a failure on one node reaches the ranks of the others, on the agents' side.

A rank whose connection to another node's rank broke waits a moment for that rank's failure in
the workers' store (``worker/process/node_worker.py``), where a failing rank records its own
(a rank whose collective timed out records its timeout: a rank that came late, its peers gone,
says it). Two failures cannot record themselves, and are seen to by the node's agent:

- a worker killed by a signal (``SIGKILL``, a crash): its agent records how it died;
- the store itself, hosted by the node the rendezvous made its rank 0, ends with that node:
  after a failure or a timeout, that node's agent keeps it until every rank has settled (read
  the failure, or had its own), a few seconds at most.
"""

from __future__ import annotations

import socket
from typing import Any

from ..._messages import Failure
from ..failures.verdict import died_failure

__all__ = ["keep_store_for_readers", "launch_ranks", "recorded_cause", "relay_signal_deaths"]


def relay_signal_deaths(
    group: Any,
    failures: dict[int, Any],
    node_rank: int,
    attempt: int,
    relayed: set[tuple[int, int]],
) -> None:
    """Record in the workers' store how each worker of ``group`` (this node's, of attempt
    ``attempt``) that ``failures`` (torch's, by torch's global rank) shows killed by a signal
    died, once each (``relayed`` keeps which were): the other nodes' ranks only see their
    connection to it lost. The launch's ranks follow the node ranks (``node_rank``), where
    torch's follow the rendezvous' order."""
    from ...worker.process.node_worker import global_rank, relay_death  # the workers' layer

    per_node = group.spec.local_world_size
    for failure in failures.values():
        rank = global_rank(node_rank, failure.local_rank, per_node)
        if failure.exitcode >= 0 or (attempt, rank) in relayed:
            continue
        relayed.add((attempt, rank))
        record = died_failure(rank, failure.pid, failure.exitcode, host=socket.gethostname())
        event = Failure(
            record.rank,
            record.type_name,
            record.message,
            "",
            None,
            host=record.host or "",
            signal_name=record.signal_name or "",
            exitcode=record.exitcode,
        )
        relay_death(group.master_addr, group.master_port, attempt, event)


def keep_store_for_readers(group: Any, attempt: int) -> None:
    """After this node's run of attempt ``attempt`` failed, on the node hosting the workers'
    store (``group``'s rendezvous rank 0): keep it until the other nodes' ranks have read the
    failure there (see :func:`~nb_accel.worker.process.node_worker.keep_store_for_readers`)."""
    from ...worker.process.node_worker import keep_store_for_readers as keep

    if group.group_world_size < 2 or group.group_rank != 0:
        return
    ranks = group.group_world_size * group.spec.local_world_size
    keep(group.master_addr, group.master_port, attempt, ranks)


def recorded_cause(group: Any, attempt: int) -> Failure | None:
    """What another node's ranks recorded in the workers' store (``group``'s) before their
    node ended attempt ``attempt``: their failure, else their collective timeout (see
    :func:`~nb_accel.worker.process.node_worker.recorded_failure`)."""
    from ...worker.process.node_worker import recorded_failure  # the workers' layer

    if group.group_world_size < 2:
        return None
    return recorded_failure(group.master_addr, group.master_port, attempt)


def launch_ranks(group: Any, node_rank: int) -> dict[int, int]:
    """The process id of each started worker of ``group`` (this node's, ``node_rank``), by
    its rank in the launch (which follows the node ranks; torch's follows the rendezvous')."""
    from ...worker.process.node_worker import global_rank  # the workers' layer

    per_node = group.spec.local_world_size
    return {
        global_rank(node_rank, worker.local_rank, per_node): worker.id
        for worker in group.workers
        if isinstance(worker.id, int)
    }
