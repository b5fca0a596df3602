"""The hosts of a launch (:class:`HostPlan`), checked before anything starts: a list of SSH
hosts, or ``"slurm"`` for the nodes of the current SLURM allocation."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from .nodes import NodePlan
from .ray_cluster import RAY, RayTransport
from .transport import SrunTransport, SshTransport, Transport, slurm_hosts

__all__ = ["LOCAL", "HostPlan", "make_host_plan"]

#: ``hosts=LOCAL``: this machine only, whatever hosts are saved.
LOCAL = "local"


@dataclass(frozen=True)
class HostPlan:
    """The hosts of a launch and how they are reached.

    Attributes:
        hosts: the hosts, host 0 first (it holds rank 0 and the rendezvous).
        transport: how each host's node process is started.
        python: the interpreter the hosts run (the kernel's, unless configured).
        agent: the options of the elastic agent every host runs (rendezvous timeout,
            restarts, ``rdzv_conf``, run id, monitor interval); each host's own place is
            filled in by :meth:`node_plan`.
    """

    hosts: tuple[str, ...]
    transport: Transport
    python: str
    agent: NodePlan = field(default_factory=NodePlan)

    def found(self, per_host: int, resource: str) -> HostPlan:
        """These hosts, where the transport finds them itself (a Ray cluster's nodes) those
        that hold ``per_host`` ranks each, one ``resource`` (``"CPU"``, ``"GPU"``) a rank;
        ``ValueError`` when too few can."""
        if self.hosts:
            return self
        return dataclasses.replace(self, hosts=self.transport.find_hosts(per_host, resource))

    @property
    def given_as(self) -> str | list[str]:
        """The ``hosts`` option that names these hosts again (``"slurm"``, or the names)."""
        return self.transport.hosts_option(self.hosts)

    @property
    def ssh_config(self) -> str | None:
        """The OpenSSH configuration file the hosts are reached with (``None``: the user's own,
        or no SSH)."""
        return self.transport.config_file()

    def node_plan(self, node_rank: int, endpoint: str, max_restarts: int | None = None) -> NodePlan:
        """The :class:`NodePlan` of host ``node_rank``, whose rendezvous is at ``endpoint``
        (``max_restarts``: the agent's, unless given)."""
        restarts = self.agent.max_restarts if max_restarts is None else max_restarts
        return dataclasses.replace(
            self.agent,
            num_nodes=len(self.hosts),
            node_rank=node_rank,
            rdzv_endpoint=endpoint,
            max_restarts=restarts,
        )

    def rank_hosts(self, per_host: int) -> list[str]:
        """Each rank's host, in rank order, with ``per_host`` ranks on each."""
        return [host for host in self.hosts for _ in range(per_host)]

    def describe(self, per_host: int) -> str:
        """E.g. ``"on each of 2 hosts over ssh (node1, node2), 4 ranks"``."""
        count, names = len(self.hosts), ", ".join(self.hosts)
        each = "on each of" if count > 1 else "on"
        plural = "s" if count > 1 else ""
        ranks = per_host * count
        return (
            f"{each} {count} host{plural} over {self.transport.name} ({names}), "
            f"{ranks} rank{'s' if ranks > 1 else ''}"
        )


def make_host_plan(
    hosts: str | Sequence[str],
    ssh_config: str | os.PathLike[str] | None,
    nodes: NodePlan,
    given_nodes: bool,
    python: str | None = None,
    num_nodes: int | None = None,
) -> HostPlan | None:
    """The launch's :class:`HostPlan` (``None`` for :data:`LOCAL`: this machine); ``ValueError``
    (or ``TypeError``) saying what is wrong, before any process starts.

    Args:
        hosts: ``"slurm"``, ``"ray"``, the host names (as ``ssh`` knows them), or
            ``"local"``.
        ssh_config: an OpenSSH client configuration file (``None``: the user's own).
        nodes: the node options (``rdzv_timeout``, ``max_restarts``, ``rdzv_conf``,
            ``rdzv_id`` and ``monitor_interval`` apply to the hosts).
        given_nodes: whether ``num_nodes``, ``node_rank`` or ``rdzv_endpoint`` was passed:
            the hosts decide those themselves.
        python: the interpreter the hosts run (``None``: the kernel's own path; on Ray, the
            node actors').
        num_nodes: how many of a Ray cluster's nodes to use (``None``: all that can hold the
            ranks); with other hosts, it counts as a node option given.
    """
    interpreter = python or sys.executable
    if hosts == LOCAL:
        return None
    if hosts == RAY:
        if given_nodes:
            raise ValueError(
                'hosts="ray" places the nodes itself (node 0 holds the rendezvous): leave '
                "node_rank and rdzv_endpoint out (num_nodes= says how many of its nodes to use)"
            )
        if ssh_config is not None:
            raise ValueError('ssh_config applies to SSH hosts, not to hosts="ray"')
        if num_nodes is not None and (not isinstance(num_nodes, int) or num_nodes < 1):
            raise ValueError(f"num_nodes must be a whole number above 0, got {num_nodes!r}")
        return HostPlan((), RayTransport(num_nodes), interpreter, nodes)
    given_nodes = given_nodes or num_nodes is not None
    if given_nodes:
        raise ValueError(
            "hosts= decides num_nodes, node_rank and rdzv_endpoint itself (one node per host, "
            "host 0's address): leave them out"
        )
    if isinstance(hosts, str):
        if hosts != "slurm":
            raise ValueError(
                f'hosts must be a list of host names, "slurm", "ray" or "local"; got {hosts!r} '
                f"(for one host, write hosts=[{hosts!r}])"
            )
        if ssh_config is not None:
            raise ValueError('ssh_config applies to SSH hosts, not to hosts="slurm"')
        return HostPlan(tuple(slurm_hosts()), SrunTransport(), interpreter, nodes)
    names = list(hosts) if isinstance(hosts, Sequence) else None
    if not names or not all(isinstance(name, str) and name.strip() for name in names):
        raise TypeError(f"hosts must be a non-empty list of host names, got {hosts!r}")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"hosts names {', '.join(repeated)} more than once: one node per host")
    config = None
    if ssh_config is not None:
        config = os.path.abspath(os.path.expanduser(os.fspath(ssh_config)))
        if not os.path.isfile(config):
            raise ValueError(f"ssh_config {config} is not a file")
    return HostPlan(tuple(names), SshTransport(config), interpreter, nodes)
