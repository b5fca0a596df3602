"""Node to node: what the nodes of a multi-node launch show each other through torch's
rendezvous store, as JSON text (:meth:`NodeCard.encode`, :meth:`NodeCard.decode`): each node's
:class:`NodeCard`, checked by every other before any worker starts
(:mod:`nb_accel.launch.multinode.node_addresses`)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

__all__ = ["NodeCard"]


@dataclass(frozen=True)
class NodeCard:
    """What a node shows the others after the rendezvous.

    Attributes:
        node_rank: its ``node_rank``.
        address: the address it advertised to torch's rendezvous.
        host: its host name.
        stack: its network stack (:func:`~nb_accel.launch.multinode.network.network_stack`).
        endpoint: its ``rdzv_endpoint``, as it was given there.
    """

    node_rank: int
    address: str
    host: str
    stack: str | None
    endpoint: str

    def encode(self) -> str:
        """The card as text, for the rendezvous store."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def decode(cls, text: str | bytes) -> NodeCard:
        """The card :meth:`encode` wrote."""
        return cls(**json.loads(text))
