"""A Ray cluster as the hosts of a launch (``hosts="ray"``): the kernel's connection to it and
the nodes that can hold a launch's ranks, found before anything starts.

The kernel uses the connection it already has (``ray.init(...)`` run in the notebook: a
``ray://`` address works too), else connects with ``ray.init(address="auto")`` (or
``RAY_ADDRESS``), as a notebook on the cluster's head node does. Ray is imported here and in
:mod:`.ray_nodes` only, when a launch names it.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any

from .ray_nodes import RayNode, RayReservation
from .transport import Reservation, Transport

__all__ = ["RAY", "RayTransport", "connected_ray", "import_ray", "ray_nodes"]

#: ``hosts=RAY``: the nodes of the Ray cluster the kernel is connected to.
RAY = "ray"


def import_ray() -> Any:
    """The ``ray`` module; a ``ValueError`` saying how to install it where it is missing."""
    try:
        import ray
    except ImportError as error:
        raise ValueError(
            'hosts="ray" needs Ray in the kernel (and the same Ray, torch and nb_accel on every '
            f"node of the cluster): pip install 'nb-accel[ray]' ({error})"
        ) from None
    return ray


def connected_ray() -> Any:
    """The ``ray`` module, connected to a cluster: the notebook's own connection, else
    ``ray.init(address="auto")`` (``RAY_ADDRESS`` where set); a ``ValueError`` saying what to
    do where no cluster answers."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    address = os.environ.get("RAY_ADDRESS") or "auto"
    _answers(address)
    try:
        ray.init(address=address, logging_level="WARNING", log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as error:
        raise ValueError(
            f'hosts="ray" found no Ray cluster at address={address!r} ({error}). Run the '
            "notebook on a node of the cluster (`ray start --head` makes one), set RAY_ADDRESS, "
            "or connect first with ray.init(address=...)"
        ) from None
    return ray


#: How long the cluster's address may take to accept a connection.
CONNECT_WAIT_S = 5.0


def _answers(address: str) -> None:
    """A ``ValueError`` at once where ``address`` is a ``host:port`` that accepts no
    connection (Ray itself retries for minutes)."""
    host, _, port = address.rpartition(":")
    if address == "auto" or "://" in address or not host or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_WAIT_S).close()
    except OSError as error:
        raise ValueError(
            f'hosts="ray" found no Ray cluster at RAY_ADDRESS={address!r}: {error}. Check the '
            "address (the head's GCS port, 6379 unless set), or unset RAY_ADDRESS on the head node"
        ) from None


def ray_nodes(ray: Any) -> tuple[list[RayNode], str | None]:
    """The cluster's alive nodes, and the kernel's node's id (``None`` where the kernel is
    not on one: a ``ray://`` client)."""
    nodes = [
        RayNode(
            str(node["NodeID"]),
            str(node["NodeManagerAddress"]),
            tuple((str(k), float(v)) for k, v in node.get("Resources", {}).items()),
        )
        for node in ray.nodes()
        if node.get("Alive")
    ]
    try:
        here: str | None = ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - a client connection has no node of its own
        here = None
    return nodes, here


@dataclass(frozen=True)
class RayTransport(Transport):
    """The nodes of a Ray cluster, each reached by a Ray actor that holds the node's bundle of
    the launch's placement group and runs its node process.

    Attributes:
        num_nodes: how many of the nodes that can hold the ranks a launch takes (``None``:
            all of them).
    """

    num_nodes: int | None = None
    name: str = "ray"

    def hosts_option(self, hosts: tuple[str, ...]) -> str | list[str]:
        """``"ray"``."""
        del hosts
        return RAY

    def command(self, host: str, python: str) -> list[str]:
        """None: a Ray node's process is started by its actor (:meth:`reserve`)."""
        raise NotImplementedError("a Ray node's process is started by its actor")

    def address(self, host: str) -> str:
        """The node's address (hosts are named by their addresses)."""
        return host

    def find_hosts(self, per_host: int, resource: str) -> tuple[str, ...]:
        """The addresses of the nodes a launch of ``per_host`` ranks on each takes: those that
        have ``per_host`` of ``resource`` (the kernel's node first), :attr:`num_nodes` of them;
        a ``ValueError`` when the cluster has fewer."""
        nodes, here = ray_nodes(connected_ray())
        able = sorted(
            (node for node in nodes if node.count(resource) >= per_host),
            key=lambda node: (node.node_id != here, node.address),
        )
        wanted = len(able) if self.num_nodes is None else self.num_nodes
        if not able or len(able) < wanted:
            unit = f"{resource}s"
            seen = ", ".join(
                f"{node.address} ({node.count(resource):g} {unit})"
                for node in sorted(nodes, key=lambda node: node.address)
            )
            needs = f"{wanted} nodes" if self.num_nodes is not None else "a node"
            raise ValueError(
                f'hosts="ray" needs {needs} with {per_host} {unit} each for '
                f"num_processes={per_host}, and {len(able)} of the cluster's nodes have that many "
                f"({seen or 'it has no node alive'}): lower num_processes or num_nodes, or add "
                "nodes to the cluster"
            )
        return tuple(node.address for node in able[:wanted])

    def reserve(self, hosts: tuple[str, ...], per_host: int, resource: str) -> Reservation:
        """A placement group with one bundle of ``per_host`` of ``resource`` (GPUs, CPUs) on
        each node (``STRICT_SPREAD``), and a node actor in each bundle."""
        ray = connected_ray()
        known = {node.address: node for node in ray_nodes(ray)[0]}
        return RayReservation(ray, [known.get(host) for host in hosts], hosts, per_host, resource)
