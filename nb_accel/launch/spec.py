"""A launch decided: one frozen :class:`LaunchSpec`, built once by :mod:`.resolve` from the
arguments, the saved configuration and the environment, and handed whole to whichever launch
backend runs it (:mod:`.backends`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from ..runtime.device_types import DeviceType
from ..runtime.device_types.cpu import CpuDevices
from .placement.hosts import HostPlan
from .placement.nodes import NodePlan
from .plan import LaunchPlan
from .request import LaunchRequest

__all__ = ["LaunchSpec", "OutputOptions", "SpecShape"]


@dataclass(frozen=True)
class OutputOptions:
    """How a launch shows what its workers say.

    Attributes:
        prefix_output: prefix each line a worker prints with its rank.
        prefix_template: a ``log_line_prefix_template`` for those prefixes (``None``: the
            rank's).
        show_progress: show the launch view (a widget in a notebook, text elsewhere).
        all_ranks_metrics: chart every rank's logged metrics, not only rank 0's.
    """

    prefix_output: bool = True
    prefix_template: str | None = None
    show_progress: bool = True
    all_ranks_metrics: bool = False


@dataclass(frozen=True)
class SpecShape:
    """What workers started for one launch must share with another to run it too: ranks,
    machines, start method, devices, precision, sharding and device mesh."""

    ranks_per_node: int
    hosts: tuple[str, ...] | None
    start_method: str
    device_type: str
    backend: str
    mixed_precision: str
    sharding: str
    mesh: str = "none"

    def differences(self, other: SpecShape) -> list[str]:
        """What this shape has where ``other`` differs, in words (``"sharding ddp"``)."""
        found = []
        for item in fields(self):
            mine, theirs = getattr(self, item.name), getattr(other, item.name)
            if mine == theirs:
                continue
            if isinstance(mine, tuple):
                mine = ", ".join(mine)
            found.append(
                f"{item.name.replace('_', ' ')} {'this machine' if mine is None else mine}"
            )
        return found


@dataclass(frozen=True)
class LaunchSpec:
    """One launch, decided and checked: nothing about it is left to the launcher to look up.

    Attributes:
        plan: what each machine runs (ranks, devices, backend, start method, precision,
            sharding, notes, the workers' variables).
        nodes: this machine's place among the machines of a multi-node launch (one machine:
            the defaults).
        hosts: the machines driven from this kernel over SSH or ``srun`` (``None``: none).
        output: how the workers' output and progress are shown.
        request: what was asked for, as given (a launch made again the same way reads it).
        reuse_workers: run on the kernel's warm workers (started by the first such launch, kept
            after it, shared with ``%%distributed``).
    """

    plan: LaunchPlan
    nodes: NodePlan = field(default_factory=NodePlan)
    hosts: HostPlan | None = None
    output: OutputOptions = field(default_factory=OutputOptions)
    request: LaunchRequest = field(default_factory=LaunchRequest, compare=False)
    reuse_workers: bool = False

    @property
    def device(self) -> DeviceType:
        """The device type the ranks run on."""
        return self.plan.device

    @property
    def machines(self) -> int:
        """How many machines take part."""
        return len(self.hosts.hosts) if self.hosts is not None else self.nodes.num_nodes

    @property
    def world_size(self) -> int:
        """Ranks in the whole launch."""
        return self.plan.num_processes * self.machines

    @property
    def first_rank(self) -> int:
        """The first rank this kernel hears from (a node's first, in a multi-node launch)."""
        return 0 if self.hosts is not None else self.nodes.node_rank * self.plan.num_processes

    @property
    def ranks_heard(self) -> int:
        """How many ranks report to this kernel: every one with hosts, else this machine's."""
        return self.world_size if self.hosts is not None else self.plan.num_processes

    @property
    def rank_hosts(self) -> list[str] | None:
        """Each rank's host, in rank order (``None``: the ranks run on this kernel's machine,
        or on nodes of their own kernels)."""
        return None if self.hosts is None else self.hosts.rank_hosts(self.plan.num_processes)

    def place_of(self) -> Callable[[int], str] | None:
        """The host of a rank, for output prefixes (``None``: no hosts)."""
        hosts = self.hosts
        if hosts is None:
            return None
        per_host = self.plan.num_processes
        return lambda rank: hosts.hosts[rank // per_host]

    @property
    def title(self) -> str:
        """The launch's line: ``"Launching 2 processes on CPU (gloo; fork)"``, with the nodes
        or hosts it spans and the restarts it may make."""
        title = self.plan.describe(world_size=self.world_size)
        if self.hosts is not None:
            title += " " + self.hosts.describe(self.plan.num_processes)
        elif self.nodes.multi_node:
            title += "; " + self.nodes.describe(self.plan.num_processes)
        restarts = (self.hosts.agent if self.hosts is not None else self.nodes).max_restarts
        if restarts and self.device.launcher is None:
            title += f"; up to {restarts} restart{'s' if restarts > 1 else ''} after a failure"
        return title

    @property
    def shape(self) -> SpecShape:
        """What another launch must match to run on this one's workers."""
        plan = self.plan
        return SpecShape(
            plan.num_processes,
            self.hosts.hosts if self.hosts is not None else None,
            plan.start_method,
            plan.device_type,
            plan.backend,
            plan.mixed_precision,
            plan.sharding,
            plan.mesh.describe() or "none",
        )

    def describe_pool(self) -> str:
        """The workers in words, without ``Launching``: ``"2 processes on CPU (gloo; fork)"``,
        with their hosts."""
        text = self.plan.describe(world_size=self.world_size).removeprefix("Launching ")
        if self.hosts is not None:
            text += " " + self.hosts.describe(self.plan.num_processes)
        return text

    def with_options(self, **changes: Any) -> LaunchRequest:
        """The request that makes a launch like this one again, ``changes`` aside: the same
        ranks, machines, start method, devices, precision and sharding, whatever the saved
        configuration says meanwhile."""
        plan, hosts = self.plan, self.hosts
        pinned: dict[str, Any] = {
            "num_processes": plan.num_processes,
            "mixed_precision": plan.mixed_precision,
            "start_method": plan.start_method,
            "cpu": plan.device_type == CpuDevices.name,
            "sharding": plan.sharding,
            "fsdp": None,
            "hosts": "local" if hosts is None else hosts.given_as,
            "ssh_config": None if hosts is None else hosts.ssh_config,
        }
        if "fsdp" in changes and "sharding" not in changes:
            pinned["sharding"] = None  # the new fsdp decides
        if "hosts" in changes and "ssh_config" not in changes:
            pinned["ssh_config"] = None
        return self.request.replace(**{**pinned, **changes})
