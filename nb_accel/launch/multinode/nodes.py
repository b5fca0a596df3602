"""A launch's nodes: one machine, or several joined through torch's elastic rendezvous."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...config import config_problems

__all__ = ["NodePlan", "NODE_FIELDS", "make_node_plan"]


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
    """

    num_nodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    rdzv_backend: str = "c10d"
    max_restarts: int = 0
    rdzv_timeout: float = 900.0

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


#: The plan's fields, in order: also the saved configuration's names for them.
NODE_FIELDS = tuple(field.name for field in dataclasses.fields(NodePlan))


def make_node_plan(
    num_nodes: object,
    node_rank: object,
    rdzv_endpoint: object,
    rdzv_backend: object,
    max_restarts: object,
    rdzv_timeout: object,
) -> NodePlan:
    """Check the multi-node options (the same rules as the saved configuration's) and return
    the plan; ``ValueError`` naming every bad option, before any process starts."""
    given = (num_nodes, node_rank, rdzv_endpoint, rdzv_backend, max_restarts, rdzv_timeout)
    values = dict(zip(NODE_FIELDS, given, strict=True))
    problems = config_problems(**values)
    relevant = {name: text for name, text in problems.items() if name in values}
    if relevant:
        raise ValueError("; ".join(f"{name} {text}" for name, text in relevant.items()))
    values["rdzv_timeout"] = float(rdzv_timeout)  # type: ignore[arg-type]
    return NodePlan(**values)  # type: ignore[arg-type]
