"""How soon the nodes meet at torch's c10d rendezvous, once they are all there.

torch paces the rendezvous for thousands of nodes: a node that joined first looks at the
store's state once a second until the round is complete, every node first waits a random
0-0.3 s to spread the joins, and a node whose store client finds nobody listening yet (node 0
starts its store as the others start their clients) tries again only about half a second
later. A launch of a few nodes meets in a second's worth of those waits. Here the pace
follows the number of nodes: the store answers about as many looks a second as torch's once a
second gives at :data:`NODES_AT_TORCH_PACE` nodes, never more often than every
:data:`FASTEST_LOOK_S`; and a node connects as soon as the store listens.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "FASTEST_LOOK_S",
    "NODES_AT_TORCH_PACE",
    "brisk_rendezvous",
    "look_every",
    "wait_listening",
]

#: The number of nodes at which a node looks once a second, as torch's always does; with
#: fewer, proportionally more often.
NODES_AT_TORCH_PACE = 160
#: The shortest time between two looks at the rendezvous' state.
FASTEST_LOOK_S = 0.05
#: How long a node waits between two tries to reach a store that is not listening yet.
CONNECT_RETRY_S = 0.01


def look_every(max_nodes: int) -> float:
    """Seconds between two looks of a waiting node at the state of a rendezvous of up to
    ``max_nodes`` nodes (torch's: 1 s)."""
    return min(1.0, max(FASTEST_LOOK_S, max_nodes / NODES_AT_TORCH_PACE))


@contextlib.contextmanager
def brisk_rendezvous(handler: Any, max_nodes: int) -> Iterator[None]:
    """While the block runs (an agent's run: its rendezvous rounds), the waits of torch's
    rendezvous ``handler`` (a look at the store's state, and how long a state read is served
    from its cache) scaled to ``max_nodes`` (see :func:`look_every`); torch's own pace after
    it. Where this torch paces its rendezvous otherwise, its own pace throughout."""
    try:
        from torch.distributed.elastic.rendezvous import dynamic_rendezvous
    except ImportError:  # pragma: no cover - every supported torch has it
        yield
        return
    torch_delay: Callable[..., None] | None = getattr(dynamic_rendezvous, "_delay", None)
    holder: Any = getattr(handler, "_state_holder", None)
    if torch_delay is None or not hasattr(holder, "_cache_duration"):
        yield
        return
    cached = holder._cache_duration
    holder._cache_duration = cached * look_every(max_nodes)
    paced_here = not getattr(torch_delay, "paced", False)  # else another agent here paced it
    if paced_here:
        dynamic_rendezvous._delay = _scaled(torch_delay, look_every(max_nodes))
    try:
        yield
    finally:
        holder._cache_duration = cached
        if paced_here:
            dynamic_rendezvous._delay = torch_delay


def _scaled(torch_delay: Callable[..., None], scale: float) -> Callable[..., None]:
    """torch's ``_delay`` (a wait of ``seconds``, or of a random time between two), each wait
    ``scale`` times as long."""

    def scaled(seconds: Any) -> None:
        if isinstance(seconds, tuple):
            torch_delay(seconds=(seconds[0] * scale, seconds[1] * scale))
        else:
            torch_delay(seconds=seconds * scale)

    scaled.paced = True  # type: ignore[attr-defined]
    return scaled


def wait_listening(host: str, port: int, within_s: float) -> bool:
    """Wait until something accepts connections at ``host:port`` (the rendezvous store,
    which node 0 may be starting right now), at most ``within_s``; whether it does. A node
    that does not find it in time lets torch's client try, which says what it found."""
    deadline = time.monotonic() + within_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        try:
            with socket.create_connection((host, port), timeout=min(1.0, left)):
                return True
        except OSError:
            time.sleep(min(CONNECT_RETRY_S, max(0.0, deadline - time.monotonic())))
