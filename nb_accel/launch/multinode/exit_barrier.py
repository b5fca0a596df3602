"""A node whose run failed checks in at torch's exit barrier as it leaves.

torch's elastic agent waits at the exit barrier (a count in the rendezvous store) only after its
workers succeeded, until every node has checked in or the barrier's timeout passes
(:data:`~.elastic_agent.EXIT_BARRIER_S`). A node whose ranks failed after the last collective
returns without checking in, so the nodes whose ranks succeeded would wait out that timeout.
:func:`check_out` counts it there without waiting.
"""

from __future__ import annotations

from typing import Any

from .unanswered import returned_within

__all__ = ["CHECK_OUT_S", "check_out"]

#: The longest a node whose run failed tries to check in at the exit barrier: the store's host
#: may be gone, or cut off (a store that answers takes milliseconds).
CHECK_OUT_S = 0.5


def check_out(store: Any, nodes: int) -> None:
    """Count this node as done at the exit barrier of ``nodes`` nodes in ``store`` (the
    rendezvous round's), without waiting for the others, within :data:`CHECK_OUT_S`."""
    from torch.distributed.elastic.agent.server.api import _TERMINAL_STATE_SYNC_ID
    from torch.distributed.elastic.utils.store import _barrier_nonblocking

    returned_within(
        CHECK_OUT_S, lambda: _barrier_nonblocking(store, nodes, _TERMINAL_STATE_SYNC_ID)
    )
