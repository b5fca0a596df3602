"""Exceptions raised by nb_accel, and the per-rank failure records they carry."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "NbAccelError",
    "LaunchError",
    "WorkerFailure",
    "WorkerError",
    "WorkerDiedError",
    "CollectiveTimeoutError",
    "RemoteTraceback",
    "is_peer_loss",
]

#: Words of errors that follow another rank's failure rather than cause it: a peer that went
#: away (gloo, the c10d store, NCCL, our own data-loader links).
_PEER_LOSS_MARKERS = (
    "connection closed by peer",
    "connection reset",
    "connection was likely closed",
    "broken pipe",
    "went away",
    "remote process exited",
    "because another rank failed",
)


def is_peer_loss(message: str) -> bool:
    """True when an error's ``message`` says that a peer went away (a lost connection, a
    closed pipe): such an error usually follows another rank's failure rather than causes it.
    The one place this is decided, in the workers and in the kernel."""
    text = message.lower()
    return any(marker in text for marker in _PEER_LOSS_MARKERS)


class NbAccelError(Exception):
    """Base class of every error nb_accel raises itself."""


class LaunchError(NbAccelError, RuntimeError):
    """A launch could not be started (bad environment, CUDA state, unpicklable payload)."""


@dataclass(frozen=True)
class WorkerFailure:
    """What one rank reported when it failed.

    Attributes:
        rank: global rank of the worker.
        type_name: qualified name of the exception's type (``"builtins.ValueError"``).
        message: ``str()`` of the exception.
        traceback: the worker-side traceback, formatted as text.
        exception: the exception itself when it could be moved to the kernel, else ``None``.
        signal_name: for a worker killed by a signal, the signal's name (``"SIGKILL"``).
        exitcode: the process exit code when the worker died without reporting.
        host: the machine the rank ran on, in a multi-node launch (``None`` on one node).
        timeout_s: for a collective timeout, the timeout the function chose itself
            (``InitProcessGroupKwargs``), when it replaced the launch's; else ``None``.
        collective: for a collective timeout, the collective the rank was in
            (``"all_reduce #3"``), when torch's flight recorder knew it; else ``None``.
        at_prompt: for a collective timeout the rank's own deadline found, whether one of the
            kernel's prompts (another rank's debugger or ``input()``) was open then.
    """

    rank: int
    type_name: str
    message: str
    traceback: str
    exception: BaseException | None = None
    signal_name: str | None = None
    exitcode: int | None = None
    host: str | None = None
    timeout_s: float | None = None
    collective: str | None = None
    at_prompt: bool = False

    @property
    def short_type(self) -> str:
        """The exception's type name without its module (``"ValueError"``)."""
        return self.type_name.rsplit(".", 1)[-1]

    @property
    def first_line(self) -> str:
        """``Type: message`` on one line, for summaries (a worker that died without
        reporting: the message alone, which says how it died)."""
        text = self.message.strip().splitlines()[0] if self.message.strip() else ""
        if self.type_name in ("signal", "exit") and text:
            return text
        return f"{self.short_type}: {text}" if text else self.short_type

    def same_error_as(self, other: WorkerFailure) -> bool:
        """True when ``other`` is the same error (type, message and traceback) on another rank."""
        return (
            self.type_name == other.type_name
            and self.message == other.message
            and self.traceback == other.traceback
            and self.signal_name == other.signal_name
        )


class WorkerError(NbAccelError, RuntimeError):
    """One or more workers failed; ``failures`` holds a record per failed rank.

    Index it by rank (``err[1]``) to get that rank's :class:`WorkerFailure`.
    """

    def __init__(self, message: str, failures: list[WorkerFailure]) -> None:
        super().__init__(message)
        self.failures = list(failures)

    @property
    def ranks(self) -> list[int]:
        """The ranks that failed, in order."""
        return sorted(f.rank for f in self.failures)

    def __getitem__(self, rank: int) -> WorkerFailure:
        for failure in self.failures:
            if failure.rank == rank:
                return failure
        raise KeyError(f"rank {rank} did not fail (failed ranks: {self.ranks})")


class WorkerDiedError(WorkerError):
    """A worker process ended without reporting: killed by a signal or exited abruptly."""


class CollectiveTimeoutError(WorkerError):
    """A collective operation did not complete within the launch's ``timeout``."""


class RemoteTraceback(Exception):
    """Carries a worker's formatted traceback; set as ``__cause__`` of a re-raised exception."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text
