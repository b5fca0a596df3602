"""Kernel to worker: what the kernel sends a worker on the worker's command pipe (the
commands of a persistent worker, the answers to a rank's prompts), one pickled frame each
(:func:`encode_command`, :func:`decode_command`). To a worker on another host they travel
inside a :class:`~nb_accel._messages.hosts.ToWorker`."""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field

__all__ = [
    "Answer",
    "Call",
    "Command",
    "Debug",
    "Execute",
    "Interrupt",
    "KernelMessage",
    "Pull",
    "Push",
    "Release",
    "Settle",
    "Stop",
    "decode_command",
    "encode_command",
]


@dataclass(frozen=True)
class Execute:
    """Kernel to persistent worker: run ``code`` in the worker's namespace; with
    ``want_value`` send back the value of its last expression (only from ``value_ranks`` when
    given: the others' values are not used). ``name`` is the cell's name in tracebacks (the
    notebook's ``In[7]``)."""

    cell: int
    code: str
    want_value: bool = False
    name: str = ""
    value_ranks: tuple[int, ...] = ()


@dataclass(frozen=True)
class Push:
    """Kernel to persistent worker: set variables (``data``: a cloudpickled dict)."""

    cell: int
    data: bytes


@dataclass(frozen=True)
class Pull:
    """Kernel to persistent worker: send back the value of variable ``name``."""

    cell: int
    name: str


@dataclass(frozen=True)
class Interrupt:
    """Kernel to persistent worker, sent right before its SIGINT: the signal is for command
    ``cell``. A worker reading that command when the signal comes finds this message behind
    it and does not run the command; one that had finished it drops both."""

    cell: int


@dataclass(frozen=True)
class Call:
    """Kernel to persistent worker: a launch on warm workers. ``data`` is the sealed
    ``(function, args, kwargs)``; the worker first takes on what a freshly started worker of
    this machine would inherit from the kernel at launch time: the environment variables the
    kernel set (``environ_set``) or removed (``environ_unset``) since the workers started,
    ``sys_path``, the working directory ``cwd`` and, where the workers were forked, the random
    generators' states (``rng``: pickled, empty otherwise). Workers on other machines inherit
    none of them (``sys_path`` and ``cwd`` ``None``: left as they are)."""

    cell: int
    data: bytes
    environ_set: dict[str, str] = field(default_factory=dict)
    environ_unset: tuple[str, ...] = ()
    sys_path: tuple[str, ...] | None = None
    cwd: str | None = None
    rng: bytes = b""


@dataclass(frozen=True)
class Debug:
    """Kernel to persistent worker: open the debugger on the frames where command
    ``failed_cell`` raised (a post-mortem), its prompts going to the kernel."""

    cell: int
    failed_cell: int


@dataclass(frozen=True)
class Answer:
    """Kernel to worker: the line typed at a :class:`~nb_accel._messages.events.Prompt`
    (``None``: no more input, as at the end of a file)."""

    text: str | None


@dataclass(frozen=True)
class Stop:
    """Kernel to persistent worker: leave the command loop and exit."""


@dataclass(frozen=True)
class Settle:
    """Kernel to persistent worker, after a failed or interrupted command: rebuild the process
    group if a collective was left unmatched. ``cell`` names this step (the same on every rank);
    ``timeout_s`` bounds the new group's collectives."""

    cell: int
    timeout_s: float


@dataclass(frozen=True)
class Release:
    """Kernel to persistent worker whose command failed while other ranks still run theirs:
    abort the process group now (``cell``: the failed command)."""

    cell: int


Command = Execute | Push | Pull | Call | Interrupt | Debug | Stop
#: Everything the kernel sends a worker.
KernelMessage = Command | Settle | Release | Answer


def encode_command(message: KernelMessage) -> bytes:
    """Serialise what the kernel sends a worker."""
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def decode_command(data: bytes) -> KernelMessage:
    """Inverse of :func:`encode_command`."""
    message = pickle.loads(data)
    kinds = (Execute, Push, Pull, Call, Interrupt, Debug, Stop, Settle, Release, Answer)
    if not isinstance(message, kinds):
        raise TypeError(f"unexpected message from the kernel: {type(message).__name__}")
    return message
