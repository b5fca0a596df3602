"""How the kernel starts a node process on each host: the system's OpenSSH client, or SLURM's
``srun`` inside an allocation.

OpenSSH, not an SSH library: it reads the user's own configuration (``~/.ssh/config``, jump
hosts, agents, certificates, ``ControlMaster``) exactly as ``ssh`` in a terminal does, so a host
the user can reach by name is reachable here with no second setup, and it is on every machine
that has SSH at all. Each node process's standard input and output are its channel to the
kernel: the kernel opens no port for it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from abc import ABC, abstractmethod
from dataclasses import dataclass

from .node_process import NodeProcess, PipedNode
from .short_commands import command_output

__all__ = [
    "NODE_MODULE",
    "CommandReservation",
    "Reservation",
    "SshTransport",
    "SrunTransport",
    "Transport",
    "slurm_hosts",
]

#: The module every host runs (``python -m ...``).
NODE_MODULE = "nb_accel.launch.hosts.remote_node"


class Reservation(ABC):
    """The hosts of one launch or pool, held from before their node processes start until
    after they ended (:meth:`release`).

    Attributes:
        hosts: the hosts, node 0 first, named as the launch's messages name them.
    """

    hosts: tuple[str, ...]

    @abstractmethod
    def start(self, index: int, python: str) -> NodeProcess:
        """Start host ``index``'s node process with ``python``."""

    @abstractmethod
    def address(self, index: int) -> str:
        """The address the other hosts reach host ``index`` at (for the rendezvous)."""

    def release(self) -> None:
        """Give the hosts back, their node processes ended (nothing to do unless a transport
        holds something for them)."""
        return None


class Transport(ABC):
    """Starts the node process of one host, with a pipe to its standard input and output."""

    #: What the hosts are reached by, in words (``"ssh"``, ``"srun"``).
    name: str

    @abstractmethod
    def command(self, host: str, python: str) -> list[str]:
        """The command that runs the node process on ``host`` with ``python``."""

    @abstractmethod
    def address(self, host: str) -> str:
        """The address the other hosts reach ``host`` at (for the rendezvous on host 0)."""

    @abstractmethod
    def hosts_option(self, hosts: tuple[str, ...]) -> str | list[str]:
        """The ``hosts`` option that names ``hosts`` reached this way."""

    def config_file(self) -> str | None:
        """The configuration file the transport reads (``None``: its default, or none)."""
        return None

    def unreachable(self, returncode: int) -> bool:
        """Whether a node process that ended with ``returncode`` before saying hello never
        reached its host (as opposed to failing there)."""
        return False

    def reserve(self, hosts: tuple[str, ...], per_host: int, resource: str) -> Reservation:
        """Hold ``hosts`` for a launch or pool of ``per_host`` ranks on each, one ``resource``
        (``"CPU"``, ``"GPU"``) a rank; a :class:`~nb_accel.errors.LaunchError` when they cannot
        be had. A command transport holds nothing: it starts each node with :meth:`command`."""
        del per_host, resource
        return CommandReservation(self, hosts)

    def find_hosts(self, per_host: int, resource: str) -> tuple[str, ...]:
        """The hosts a launch of ``per_host`` ranks on each (one ``resource`` a rank) takes,
        where the transport finds them itself (``()``: the hosts were named)."""
        del per_host, resource
        return ()


@dataclass(frozen=True)
class CommandReservation(Reservation):
    """Hosts reached by a transport's command (``ssh``, ``srun``), held by nothing."""

    transport: Transport
    hosts: tuple[str, ...]

    def start(self, index: int, python: str) -> NodeProcess:
        """The transport's command for host ``index``, run here."""
        command = self.transport.command(self.hosts[index], python)
        return PipedNode(command, self.transport.unreachable)

    def address(self, index: int) -> str:
        """The transport's address of host ``index``."""
        return self.transport.address(self.hosts[index])


@dataclass(frozen=True)
class SshTransport(Transport):
    """OpenSSH's client, with ``config`` (an ``ssh_config`` file; ``None``: the user's own) and
    ``connect_timeout_s`` for each connection.

    ``BatchMode`` is on: a host that would ask for a password or a host key confirmation
    fails at once, saying so, instead of waiting for input nobody can type.
    """

    config: str | None = None
    connect_timeout_s: float = 10.0
    name: str = "ssh"

    def _base(self) -> list[str]:
        ssh = shutil.which("ssh") or "ssh"
        options = [
            "-o",
            "BatchMode=yes",
            "-o",
            f"ConnectTimeout={max(int(self.connect_timeout_s), 1)}",
        ]
        return [ssh, *(["-F", self.config] if self.config else []), *options]

    def hosts_option(self, hosts: tuple[str, ...]) -> str | list[str]:
        """The host names."""
        return list(hosts)

    def config_file(self) -> str | None:
        """:attr:`config`."""
        return self.config

    def command(self, host: str, python: str) -> list[str]:
        """``ssh [-F config] -T host python -m nb_accel.launch.hosts.remote_node``."""
        remote = f"exec {shlex.quote(python)} -m {NODE_MODULE}"
        return [*self._base(), "-T", host, remote]

    def address(self, host: str) -> str:
        """``host``'s ``HostName`` as the configuration resolves it (``ssh -G``)."""
        try:
            shown = command_output([*self._base(), "-G", host], timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            return host
        for line in shown.splitlines():
            key, _, value = line.partition(" ")
            if key == "hostname" and value:
                return value.strip()
        return host

    def unreachable(self, returncode: int) -> bool:
        """``ssh`` itself fails with 255 (no connection, refused authentication)."""
        return returncode == 255


@dataclass(frozen=True)
class SrunTransport(Transport):
    """SLURM's ``srun``, one task on each named node of the current allocation."""

    name: str = "srun"

    def hosts_option(self, hosts: tuple[str, ...]) -> str | list[str]:
        """``"slurm"``: the nodes of the allocation."""
        del hosts
        return "slurm"

    def command(self, host: str, python: str) -> list[str]:
        """``srun -N1 -n1 -w host ... python -m nb_accel.launch.hosts.remote_node``."""
        srun = shutil.which("srun") or "srun"
        return [
            srun,
            *("--nodes=1", "--ntasks=1", f"--nodelist={host}", "--kill-on-bad-exit=1"),
            *("--quiet", "--unbuffered", "--overlap"),
            python,
            *("-m", NODE_MODULE),
        ]

    def address(self, host: str) -> str:
        """The node's ``NodeAddr`` (``scontrol show node``; its name when SLURM gives none)."""
        scontrol = shutil.which("scontrol") or "scontrol"
        try:
            asked = [scontrol, "show", "node", "--oneliner", host]
            shown = command_output(asked, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            return host
        for field in shown.split():
            key, _, value = field.partition("=")
            if key == "NodeAddr" and value:
                return value
        return host


def slurm_hosts() -> list[str]:
    """The nodes of the current allocation (``SLURM_JOB_NODELIST``, expanded by ``scontrol
    show hostnames``); ``ValueError`` outside one."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if not nodelist:
        raise ValueError(
            'hosts="slurm" needs a SLURM allocation (SLURM_JOB_NODELIST is not set): start the '
            "kernel inside one (salloc, sbatch, or a JupyterHub spawned by SLURM)"
        )
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        raise ValueError('hosts="slurm" needs SLURM\'s scontrol on PATH to list the nodes')
    try:
        listed = command_output([scontrol, "show", "hostnames", nodelist], timeout=30)
    except subprocess.TimeoutExpired as error:
        raise ValueError(
            f"scontrol show hostnames {nodelist} did not answer in 30 s: is SLURM's controller up "
            "(scontrol ping)?"
        ) from error
    hosts = listed.stdout.split()
    if listed.returncode != 0 or not hosts:
        raise ValueError(f"scontrol show hostnames {nodelist} failed: {listed.stderr.strip()}")
    return hosts
