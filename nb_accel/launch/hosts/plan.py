"""The hosts of a launch, checked before anything starts: a list of SSH hosts, or ``"slurm"``
for the nodes of the current SLURM allocation."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from ..multinode.nodes import NodePlan
from .launcher import HostPlan
from .transport import SrunTransport, SshTransport, slurm_hosts

__all__ = ["make_host_plan"]


def make_host_plan(
    hosts: str | Sequence[str],
    ssh_config: str | os.PathLike[str] | None,
    nodes: NodePlan,
    given_nodes: bool,
    python: str | None = None,
) -> HostPlan:
    """The launch's :class:`HostPlan`; ``ValueError`` (or ``TypeError``) saying what is wrong,
    before any process starts.

    Args:
        hosts: ``"slurm"``, or the host names (as ``ssh`` knows them).
        ssh_config: an OpenSSH client configuration file (``None``: the user's own).
        nodes: the node options (``rdzv_timeout`` and ``max_restarts`` apply to the hosts).
        given_nodes: whether ``num_nodes``, ``node_rank`` or ``rdzv_endpoint`` was passed:
            the hosts decide those themselves.
        python: the interpreter the hosts run (``None``: the kernel's own path).
    """
    interpreter = python or sys.executable
    if given_nodes:
        raise ValueError(
            "hosts= decides num_nodes, node_rank and rdzv_endpoint itself (one node per host, "
            "host 0's address): leave them out"
        )
    if isinstance(hosts, str):
        if hosts != "slurm":
            raise ValueError(
                f'hosts must be a list of host names, or "slurm"; got {hosts!r} (for one host, '
                f"write hosts=[{hosts!r}])"
            )
        if ssh_config is not None:
            raise ValueError('ssh_config applies to SSH hosts, not to hosts="slurm"')
        return HostPlan(
            tuple(slurm_hosts()),
            SrunTransport(),
            interpreter,
            nodes.rdzv_timeout,
            nodes.max_restarts,
        )
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
    return HostPlan(
        tuple(names),
        SshTransport(config),
        interpreter,
        nodes.rdzv_timeout,
        nodes.max_restarts,
    )
