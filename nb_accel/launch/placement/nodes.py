"""A launch's nodes: one machine, or several joined through torch's elastic rendezvous."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ...config import config_problems

__all__ = [
    "DEFAULT_RDZV_ID",
    "MONITOR_INTERVAL_S",
    "NodePlan",
    "NODE_FIELDS",
    "STATIC_BACKEND",
    "check_monitor_interval",
    "check_rdzv_conf",
    "check_rdzv_id",
    "make_node_plan",
    "pop_join_timeout",
]

#: The rendezvous run id when none is given (Accelerate's ``rdzv_id="none"`` reads as this).
DEFAULT_RDZV_ID = "nb_accel"
#: How often the elastic agent looks at its workers when ``monitor_interval`` is not given.
MONITOR_INTERVAL_S = 0.05

#: Keys of ``rdzv_conf`` that nb_accel sets from other options, and what to use instead.
_DECIDED_KEYS = {
    "backend": "rdzv_backend",
    "endpoint": "rdzv_endpoint",
    "run_id": "rdzv_id",
    "min_nodes": "num_nodes",
    "max_nodes": "num_nodes",
    "local_addr": "nothing: nb_accel advertises the address the other nodes reach",
    "is_host": "node_rank (node 0 hosts the rendezvous)",
}


@dataclass(frozen=True)
class NodePlan:
    """Where a launch runs beyond this machine.

    Attributes:
        num_nodes: machines taking part (1: this one only).
        node_rank: this machine's number, 0 to ``num_nodes - 1``; its ranks are
            ``node_rank * num_processes`` and up.
        rdzv_endpoint: ``host:port`` of node 0's rendezvous.
        rdzv_backend: the rendezvous backend (``"c10d"``).
        max_restarts: times the worker group is restarted after a failure.
        rdzv_timeout: seconds to wait for the rendezvous (reaching it, and every node joining).
        rdzv_conf: more options for torch's rendezvous handler (``RendezvousParameters``),
            set over nb_accel's own; never ``join_timeout`` (that is ``rdzv_timeout``).
        rdzv_id: the rendezvous run id, the same on every node.
        monitor_interval: how often the elastic agent looks at its workers (seconds).
    """

    num_nodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    rdzv_backend: str = "c10d"
    max_restarts: int = 0
    rdzv_timeout: float = 900.0
    rdzv_conf: dict[str, Any] = field(default_factory=dict, hash=False)
    rdzv_id: str = DEFAULT_RDZV_ID
    monitor_interval: float = MONITOR_INTERVAL_S

    @property
    def multi_node(self) -> bool:
        """True when more than one machine takes part."""
        return self.num_nodes > 1

    def describe(self, per_node: int) -> str:
        """E.g. ``"node 1 of 2 (ranks 2-3 of 4), rendezvous at host:29500"``."""
        first = self.node_rank * per_node
        return (
            f"node {self.node_rank} of {self.num_nodes} (ranks {first}-{first + per_node - 1} "
            f"of {per_node * self.num_nodes}), rendezvous at {self.rdzv_endpoint}"
        )


#: Accelerate's default ``rdzv_backend``, taken as c10d (see :func:`make_node_plan`).
STATIC_BACKEND = "static"

#: The plan's fields that the saved configuration holds too, under the same names, in order.
NODE_FIELDS = (
    "num_nodes",
    "node_rank",
    "rdzv_endpoint",
    "rdzv_backend",
    "max_restarts",
    "rdzv_timeout",
)


def check_rdzv_conf(rdzv_conf: object) -> dict[str, Any]:
    """``rdzv_conf`` as a new dict (``{}`` for ``None``): ``TypeError`` when it is not a
    mapping with ``str`` keys, ``ValueError`` for a key nb_accel sets from another option."""
    if rdzv_conf is None:
        return {}
    if not isinstance(rdzv_conf, Mapping):
        raise TypeError(
            "rdzv_conf must be a dict of torch's rendezvous options (e.g. "
            f'{{"join_timeout": 600}}), got {type(rdzv_conf).__name__}'
        )
    bad = [key for key in rdzv_conf if not isinstance(key, str)]
    if bad:
        raise TypeError(f"rdzv_conf's keys must be option names (str), got {bad[0]!r}")
    for key in rdzv_conf:
        if key in _DECIDED_KEYS:
            raise ValueError(
                f"rdzv_conf[{key!r}] is set by nb_accel; leave it out of rdzv_conf and use "
                f"{_DECIDED_KEYS[key]}"
            )
    return dict(rdzv_conf)


def check_rdzv_id(rdzv_id: object) -> str:
    """The rendezvous run id: ``None`` and Accelerate's ``"none"`` read as
    :data:`DEFAULT_RDZV_ID`; ``TypeError`` when not a ``str``, ``ValueError`` when blank."""
    if rdzv_id is None or rdzv_id == "none":
        return DEFAULT_RDZV_ID
    if not isinstance(rdzv_id, str):
        raise TypeError(
            f"rdzv_id must be a str (the run id, the same on every node), got "
            f"{type(rdzv_id).__name__}"
        )
    if not rdzv_id.strip():
        raise ValueError("rdzv_id must not be blank: give a name, the same on every node")
    return rdzv_id


def check_monitor_interval(monitor_interval: object) -> float:
    """The agent's polling interval in seconds (``None``: :data:`MONITOR_INTERVAL_S`);
    ``TypeError`` when not a number, ``ValueError`` unless above 0 and finite."""
    if monitor_interval is None:
        return MONITOR_INTERVAL_S
    if isinstance(monitor_interval, bool) or not isinstance(monitor_interval, (int, float)):
        raise TypeError(
            f"monitor_interval must be a number of seconds, got {type(monitor_interval).__name__}"
        )
    if not (math.isfinite(monitor_interval) and monitor_interval > 0):
        raise ValueError(
            f"monitor_interval must be a number of seconds above 0 (e.g. 0.1), got "
            f"{monitor_interval!r}"
        )
    return float(monitor_interval)


def pop_join_timeout(conf: dict[str, Any], rdzv_timeout: object) -> object:
    """The rendezvous timeout, ``rdzv_timeout`` (``None``: not given) or the ``join_timeout``
    taken out of ``conf``: torch's (and Accelerate's) name for it. Both given and different:
    a ``ValueError``."""
    if "join_timeout" not in conf:
        return rdzv_timeout
    given = conf.pop("join_timeout")
    try:
        join = float(given)
    except (TypeError, ValueError):
        raise ValueError(
            f"rdzv_conf['join_timeout'] must be a number of seconds, got {given!r}"
        ) from None
    if not join > 0:
        raise ValueError(
            f"rdzv_conf['join_timeout'] must be a number of seconds above 0, got {given!r}"
        )
    if rdzv_timeout is not None and rdzv_timeout != join:
        raise ValueError(
            f"rdzv_timeout={rdzv_timeout!r} and rdzv_conf['join_timeout']={given!r} disagree: "
            "both are the seconds to wait for every node to join; give only one"
        )
    return join


def make_node_plan(
    num_nodes: object,
    node_rank: object,
    rdzv_endpoint: object,
    rdzv_backend: object,
    max_restarts: object,
    rdzv_timeout: object,
    *,
    rdzv_conf: object = None,
    rdzv_id: object = None,
    monitor_interval: object = None,
) -> NodePlan:
    """Check the multi-node options (the same rules as the saved configuration's) and return
    the plan; ``ValueError`` (``TypeError`` for a wrong kind of value) naming the option, before
    any process starts. A ``join_timeout`` in ``rdzv_conf`` is ``rdzv_timeout`` by torch's name:
    it must agree with it (:func:`pop_join_timeout`). Accelerate's default backend,
    ``"static"`` (a fixed set of nodes, ranks by ``node_rank``), is what the c10d rendezvous
    gives here: every node's ranks follow from its ``node_rank``."""
    if rdzv_backend == STATIC_BACKEND:
        rdzv_backend = "c10d"
    conf = check_rdzv_conf(rdzv_conf)
    rdzv_timeout = pop_join_timeout(conf, rdzv_timeout)
    given = (num_nodes, node_rank, rdzv_endpoint, rdzv_backend, max_restarts, rdzv_timeout)
    values: dict[str, Any] = dict(zip(NODE_FIELDS, given, strict=True))
    problems = config_problems(**values)
    relevant = {name: text for name, text in problems.items() if name in values}
    if relevant:
        raise ValueError("; ".join(f"{name} {text}" for name, text in relevant.items()))
    values["rdzv_timeout"] = float(rdzv_timeout)  # type: ignore[arg-type]
    return NodePlan(
        **values,
        rdzv_conf=conf,
        rdzv_id=check_rdzv_id(rdzv_id),
        monitor_interval=check_monitor_interval(monitor_interval),
    )
