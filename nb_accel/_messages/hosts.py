"""Kernel and a host's node process: what they say to each other over the host's channel (the
standard input and output of ``ssh`` or ``srun``), framed and pickled by
:mod:`nb_accel.launch.hosts.protocol`.

The node speaks first (:class:`Hello`: its versions, and a free port for the rendezvous should
it be node 0); the kernel answers with the :class:`NodeJob` or :class:`StopNode`. While the
workers run, the node forwards every frame a worker sends (:class:`Forwarded`), unread, says
when its agent restarts them (:class:`AgentRestarting`), and ends with :class:`AgentEnded`.
The end of the channel stops the node and its workers.

A pool spread over hosts also talks to its workers through the node: commands go down
(:class:`ToWorker`), the kernel's interrupt becomes a signal there (:class:`SignalWorker`), and
questions only the host can answer (where a rank is, its memory) come back as a
:class:`WorkersAnswer` to an :class:`AskWorkers`.

The kernel also says when one of its prompts (a rank's debugger, ``input()``) opens and closes
(:class:`PromptState`): the node keeps the time in its prompt clock, which its ranks leave out
of their collective timeout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "AgentEnded",
    "Alive",
    "AgentRestarting",
    "AskWorkers",
    "Forwarded",
    "FromNode",
    "Hello",
    "NodeJob",
    "PromptState",
    "SignalWorker",
    "StopNode",
    "ToNode",
    "ToWorker",
    "Versions",
    "WorkersAnswer",
]


@dataclass(frozen=True)
class Versions:
    """What must match between the kernel and a host: Python (major.minor), torch, nb_accel."""

    python: str
    torch: str
    nb_accel: str

    def differences(self, other: Versions) -> list[str]:
        """``"torch 2.13.0 (here 2.12.1)"`` for each field that differs from ``other``'s (the
        kernel's)."""
        return [
            f"{name} {getattr(self, name)} (the kernel has {getattr(other, name)})"
            for name in ("python", "torch", "nb_accel")
            if getattr(self, name) != getattr(other, name)
        ]


@dataclass(frozen=True)
class Hello:
    """Node to kernel, first: who it is, what it runs, and a port free on it. It travels as a
    plain dict (:meth:`as_dict`), which any nb_accel can read: a host with another version is
    told apart by it, not by a failure to unpickle."""

    hostname: str
    versions: Versions
    free_port: int
    executable: str

    def as_dict(self) -> dict[str, Any]:
        """The hello as plain data."""
        return {
            "hostname": self.hostname,
            "free_port": self.free_port,
            "executable": self.executable,
            **vars(self.versions),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Hello:
        """The hello a node sent (missing fields read as ``"?"``)."""
        versions = Versions(*(str(data.get(name, "?")) for name in ("python", "torch", "nb_accel")))
        return cls(
            str(data.get("hostname", "?")),
            versions,
            int(data.get("free_port", 0)),
            str(data.get("executable", "?")),
        )


@dataclass(frozen=True)
class NodeJob:
    """Kernel to node: run this node's share of the launch.

    Attributes:
        plan: what the node's machine runs, the launch's
            :class:`~nb_accel.launch.plan.LaunchPlan` (ranks per node, device type, backend,
            ...); typed ``Any`` here, where the launch's classes are out of reach.
        nodes: this node's place among the launch's nodes and the elastic agent's options,
            a :class:`~nb_accel.launch.placement.nodes.NodePlan` (typed ``Any`` likewise).
        payload: the pickled ``(function, args, kwargs)``.
        env: the environment variables the node's workers set first.
    """

    plan: Any
    nodes: Any
    payload: bytes
    env: dict[str, str]


@dataclass(frozen=True)
class StopNode:
    """Kernel to node: stop the workers (or do not start them) and exit."""


@dataclass(frozen=True)
class Alive:
    """Node to kernel: a sign of life, sent at a steady pace while the node has a job. A host
    that falls silent (cut off the network, frozen, down) tells nobody else: the kernel gives
    it up once it has heard nothing from it for a while."""


@dataclass(frozen=True)
class Forwarded:
    """Node to kernel: a frame worker connection ``sender`` (numbered by the node) sent."""

    sender: int
    data: bytes


@dataclass(frozen=True)
class AgentRestarting:
    """Node to kernel: its agent restarts the workers for ``attempt`` (their
    ``TORCHELASTIC_RESTART_COUNT``); ``died``: the workers of the attempt before that ended,
    as ``(local rank, pid, exit code)``."""

    attempt: int
    died: list[tuple[int, int, int]]


@dataclass(frozen=True)
class AgentEnded:
    """Node to kernel, last: how its agent ended.

    Attributes:
        died: workers that ended without reporting, as ``(local rank, pid, exit code)``.
        problem: the error that stopped the node before or between its workers (the nodes
            could not meet, the rendezvous was lost), in words; empty when there was none.
        stopped: the node was told to stop (or its channel ended).
        notes: what the node says of the tracker runs it ended for its workers, which were
            stopped with a run open (their store may be on this host only), for the kernel
            to show.
    """

    died: list[tuple[int, int, int]] = field(default_factory=list)
    problem: str = ""
    stopped: bool = False
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ToWorker:
    """Kernel to node: write ``data`` (one frame) to worker connection ``sender``."""

    sender: int
    data: bytes


@dataclass(frozen=True)
class SignalWorker:
    """Kernel to node: send ``signum`` to the worker at the other end of connection
    ``sender``."""

    sender: int
    signum: int


@dataclass(frozen=True)
class PromptState:
    """Kernel to node: a prompt of the kernel opened (``is_open``) or closed, now."""

    is_open: bool


@dataclass(frozen=True)
class AskWorkers:
    """Kernel to node: a question about some of its workers, answered by a :class:`WorkersAnswer`
    with the same ``request`` number.

    Attributes:
        request: the question's number.
        what: ``"where"`` (their stacks), ``"where+collectives"`` (and their last
            collectives), ``"abort"`` (abort their collectives; no answer), ``"memory"``
            (their resident memory in MB) or ``"frozen"`` (whether each is stopped: SIGSTOP,
            Ctrl-Z). A frozen worker cannot say where it is: it is left out of ``"where"``.
        senders: the workers asked about, as rank -> connection number.
        wait_s: how long the node waits for each round of a worker's answer (its stacks,
            again if cut short, its last collective).
    """

    request: int
    what: str
    senders: dict[int, int]
    wait_s: float = 1.0


@dataclass(frozen=True)
class WorkersAnswer:
    """Node to kernel: the answer to :class:`AskWorkers` ``request``, by rank."""

    request: int
    value: dict[int, Any]


#: What the kernel sends a node.
ToNode = NodeJob | StopNode | ToWorker | SignalWorker | PromptState | AskWorkers
#: What a node sends the kernel (its :class:`Hello` first, as a plain dict).
FromNode = Forwarded | AgentRestarting | AgentEnded | WorkersAnswer | Alive
