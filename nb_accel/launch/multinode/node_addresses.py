"""The addresses the nodes of a multi-node launch give each other, checked before any worker
starts.

torch's rendezvous tells every worker to meet at the address its first node advertised
(``MASTER_ADDR``); unless told otherwise, a node advertises its host name, which the default
``/etc/hosts`` of Debian, Ubuntu and many containers maps to ``127.0.1.1``: on another machine
that name means that machine itself, and the workers wait there for ever. So here:

- node 0 advertises the host of its ``rdzv_endpoint``, the name the other nodes reach it by;
  every other node advertises its own address on the route towards node 0;
- after the rendezvous each node shows the others a :class:`NodeCard`; a node that would meet
  a node of another machine at a loopback address (or at a name it cannot resolve) names the
  address and what it resolved to, and every node stops with that message at once;
- the workers' sockets (``GLOO_SOCKET_IFNAME``, ``NCCL_SOCKET_IFNAME``, where the user has set
  neither) go through the interface whose address routes to the other machines.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence

from ..._messages import NodeCard
from ...runtime.device_types.group_backends import uses_gloo
from .network import (
    addresses_of,
    interface_addresses,
    interface_of,
    is_loopback,
    network_stack,
    source_toward,
    split_endpoint,
)

__all__ = ["NodeCard", "NodeNetwork", "SOCKET_VARIABLES"]

#: The variables naming the interface of the backends' sockets, set for the workers.
SOCKET_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def _resolved(name: str, addresses: Sequence[str]) -> str:
    """``'name' resolves here to 127.0.1.1`` or, for an address, ``127.0.0.1``."""
    if list(addresses) == [name]:
        return name
    return f"{name!r}, which resolves here to {', '.join(addresses)}"


class NodeNetwork:
    """This node's side of the launch on the network.

    Args:
        endpoint: ``rdzv_endpoint`` as given on this node.
        node_rank: this node's number.
        backend: the process group's backend (``"gloo"``, ``"nccl"`` or ``"cuda:nccl,cpu:gloo"``).
    """

    def __init__(self, endpoint: str, node_rank: int, backend: str = "gloo") -> None:
        host, _ = split_endpoint(endpoint)
        self.endpoint = endpoint
        self.node_rank = node_rank
        self._backend = backend
        self._node0 = addresses_of(host)
        own = interface_addresses()
        self._node0_here = bool(self._node0) and all(
            is_loopback(address) or address in own for address in self._node0
        )
        #: What this node advertises (``None``: torch's own choice, the host name).
        self.address = host if node_rank == 0 else self._toward_node0()
        #: This node's card.
        self.card = NodeCard(
            node_rank,
            self.address or socket.getfqdn(),
            socket.gethostname(),
            network_stack(),
            endpoint,
        )

    def _toward_node0(self) -> str | None:
        for address in self._node0:
            if (source := source_toward(address)) is not None:
                return source
        return None

    def elsewhere(self, card: NodeCard) -> bool:
        """True when the node of ``card`` has another loopback than this one (another machine,
        or another network namespace)."""
        if card.stack is not None and self.card.stack is not None:
            return card.stack != self.card.stack
        return not self._node0_here  # unknown: as node 0 is

    def problem(self, cards: Sequence[NodeCard], me: int, master_addr: str) -> str | None:
        """Why this node cannot meet the others, or ``None``.

        Args:
            cards: every node's card, by rendezvous rank (the first hosts the workers' store).
            me: this node's rendezvous rank.
            master_addr: where torch tells the workers to meet (``MASTER_ADDR``).
        """
        if me != 0:
            problem = self._store_problem(cards[0], master_addr)
            if problem is not None:
                return problem
        return self._socket_problem([card for rank, card in enumerate(cards) if rank != me])

    def _store_problem(self, host: NodeCard, master_addr: str) -> str | None:
        """Why the workers here cannot reach the store at ``master_addr``, on ``host``'s node."""
        if not self.elsewhere(host):
            return None
        who = f"node {host.node_rank} (host {host.host})"
        found = addresses_of(master_addr)
        if not found:
            return (
                f"node {self.node_rank} cannot look up {master_addr!r}, the address {who} "
                f"advertised for the workers to meet at. {self._advice(host)}"
            )
        if not all(is_loopback(address) for address in found):
            return None
        return (
            f"node {self.node_rank} would meet the workers of {who} at "
            f"{_resolved(master_addr, found)}: a loopback address, this machine itself, while "
            f"node {host.node_rank} runs on another machine. {self._advice(host)}"
        )

    def _advice(self, host: NodeCard) -> str:
        if host.node_rank == 0:
            given = "Node 0 advertises the host of its rdzv_endpoint"
        else:
            given = f"Node {host.node_rank} advertises its address towards node 0's rdzv_endpoint"
        return (
            f"{given} ({host.endpoint!r} there): launch every node with the same rdzv_endpoint, "
            "node 0's address as the other machines reach it (node "
            f"{self.node_rank} was given {self.endpoint!r})."
        )

    def socket_interface(self, peers: Sequence[NodeCard]) -> str | None:
        """The interface whose address routes to the other machines (the loopback interface
        when every node shares this one's); ``None`` when no route says."""
        targets = [] if self._node0_here else list(self._node0)
        for card in peers:
            if self.elsewhere(card):
                targets += addresses_of(card.address)
        for target in targets:
            source = source_toward(target)
            if source is not None and not is_loopback(source):
                if (name := interface_of(source)) is not None:
                    return name
        if any(self.elsewhere(card) for card in peers):
            return None
        return interface_of("127.0.0.1") or interface_of("::1")

    def _socket_problem(self, peers: Sequence[NodeCard]) -> str | None:
        """Why gloo's sockets here would offer the other machines a loopback address."""
        away = [card for card in peers if self.elsewhere(card)]
        if not uses_gloo(self._backend) or not away:
            return None
        other = f"node {away[0].node_rank} (host {away[0].host}) runs on another machine"
        chosen = os.environ.get("GLOO_SOCKET_IFNAME")
        if chosen:
            names = [name.strip() for name in chosen.split(",")]
            own = interface_addresses()
            held = [address for address, name in own.items() if name in names]
            if held and all(is_loopback(address) for address in held):
                return (
                    f"node {self.node_rank} has GLOO_SOCKET_IFNAME={chosen!r}, a loopback "
                    f"interface, while {other}: set it to the interface that reaches the other "
                    "machines, or unset it to have it chosen"
                )
            return None
        if self.socket_interface(peers) is not None:
            return None
        name = socket.gethostname()
        found = addresses_of(name)
        if found and all(is_loopback(address) for address in found):
            return (
                f"node {self.node_rank} found no route to the other machines ({other}), and "
                f"its host name is {_resolved(name, found)}, a loopback address gloo would "
                "offer them: set GLOO_SOCKET_IFNAME to the interface that reaches them"
            )
        return None

    def worker_env(
        self, peers: Sequence[NodeCard], environ: Mapping[str, str] | None = None
    ) -> dict[str, str]:
        """The socket variables for this node's workers, those unset in ``environ`` (the
        process environment by default)."""
        environ = os.environ if environ is None else environ
        missing = [name for name in SOCKET_VARIABLES if name not in environ]
        name = self.socket_interface(peers) if missing else None
        return dict.fromkeys(missing, name) if name else {}
