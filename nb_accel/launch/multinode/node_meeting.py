"""Right after each rendezvous, before any worker starts, the nodes meet through the round's
rendezvous store: each shows its :class:`~nb_accel._messages.NodeCard`, each says whether it
found a problem (a loopback address another machine cannot reach), and each counts the rounds
it has seen, so that every node numbers the attempt alike.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from ..._messages import NodeCard
from ...errors import LaunchError
from .node_addresses import NodeNetwork

__all__ = ["RESTART_COUNT", "meet"]

#: Keys of the rendezvous store (under the round's prefix) for the nodes' cards and verdicts.
_CARD_KEY = "nb_accel/node_card/{}"
_VERDICT_KEY = "nb_accel/node_verdict/{}"
_READ_KEY = "nb_accel/node_read/{}"
_ROUND_KEY = "nb_accel/node_round/{}"
#: The variable that numbers the attempts (torch sets it per node: see :func:`meet`).
RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
#: How long a node that found a problem waits for the others to have read it.
_READ_WAIT_S = 10.0


#: How often a node looks for the other nodes' cards and verdicts (seconds).
_POLL_S = 0.01


def _exchange(store: Any, key: str, me: int, count: int, value: str, wait_s: float) -> list[bytes]:
    """Put ``value`` under this node's ``key`` and return every node's, in rendezvous order,
    waiting for them up to ``wait_s`` (in short steps, so an interrupt is heard at once)."""
    from torch.distributed.elastic.rendezvous.api import (
        RendezvousConnectionError,
        RendezvousTimeoutError,
    )

    keys = [key.format(rank) for rank in range(count)]
    deadline = time.monotonic() + wait_s
    try:
        store.set(keys[me], value)
        while not store.check(keys):
            if time.monotonic() > deadline:
                raise RendezvousTimeoutError(
                    f"the other nodes did not show their addresses within {wait_s:g} s"
                )
            time.sleep(_POLL_S)
        return [store.get(name) for name in keys]
    except RendezvousTimeoutError:
        raise
    except Exception as error:  # the store raises different kinds in different torch versions
        text = f"the nodes could not compare their addresses ({error})"
        raise RendezvousConnectionError(text) from error


def meet(
    worker_group: Any,
    network: NodeNetwork,
    make_args: Callable[[dict[str, str]], tuple[Any, ...]],
    wait_s: float,
    rounds: int,
) -> int:
    """After a rendezvous (this node's ``rounds``-th): check with the other nodes that
    everyone can meet, then give this node's workers the interface for their sockets and the
    attempt's number (returned). Raises :class:`LaunchError` on every node when one of them found a
    problem.

    The number is the same on every node: torch counts only the restarts after a failure of
    the node's own workers, so a node restarted because another node's workers failed keeps
    its count, and two nodes would tell the same attempt by different numbers. Every node
    takes part in every rendezvous (their number is fixed), so the rendezvous each node has
    seen number the attempts alike; the workers' ``TORCHELASTIC_RESTART_COUNT`` is that."""
    store, me = worker_group.store, worker_group.group_rank
    count = worker_group.group_world_size
    found = _exchange(store, _CARD_KEY, me, count, network.card.encode(), wait_s)
    cards = [NodeCard.decode(text) for text in found]
    master_addr = getattr(worker_group, "master_addr", None)
    problem = network.problem(cards, me, master_addr) if master_addr else None
    try:
        verdicts = _exchange(store, _VERDICT_KEY, me, count, problem or "", wait_s)
    except Exception:
        if problem:  # the others may have stopped already: this node's own finding stands
            raise LaunchError(problem) from None
        raise
    problems = [text.decode() for text in verdicts if text]
    if problems:
        # Every node has read the verdicts before any leaves: the node hosting the store
        # closes it as it stops, and a node still reading would only see a lost connection.
        with contextlib.suppress(Exception):
            _exchange(store, _READ_KEY, me, count, "read", _READ_WAIT_S)
        raise LaunchError(problems[0])
    seen = _exchange(store, _ROUND_KEY, me, count, str(rounds), wait_s)
    attempt = max(int(text) for text in seen) - 1
    peers = [card for rank, card in enumerate(cards) if rank != me]
    worker_group.spec.args = make_args({**network.worker_env(peers), RESTART_COUNT: str(attempt)})
    return attempt
