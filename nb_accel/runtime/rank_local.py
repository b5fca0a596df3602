"""Values that belong to one rank, where one process may run several ranks as threads.

A worker process is normally one rank, and what belongs to a rank (the states behind
``PartialState``, ``AcceleratorState`` and ``GradientState``, the event channel, the progress
reporter, the streams ``print`` writes to) is held by the process. On TPU v2 and v3,
``torch_xla`` runs two ranks in each process, one thread per TensorCore (and on its CPU device
one thread per device). There each rank's thread calls :func:`become_rank_thread` first; from
then on every :class:`RankLocal` value it reads or sets is its own, and :func:`install_stream`
routes its ``print`` output to its own stream. Threads that are no rank's (those a library
starts) see the process's values, and their output goes to the first rank's stream.
"""

from __future__ import annotations

import io
import sys
import threading
from collections.abc import Callable
from typing import Any, Generic, Literal, TypeVar

__all__ = [
    "RankLocal",
    "RankLocalDict",
    "RoutedStream",
    "become_rank_thread",
    "install_stream",
    "is_rank_thread",
]

T = TypeVar("T")

_threads = threading.local()
_install_lock = threading.Lock()


def become_rank_thread() -> None:
    """Give the calling thread rank-local values of its own, each starting afresh."""
    _threads.values = {}


def is_rank_thread() -> bool:
    """True in a thread that runs one of several ranks of its process."""
    return getattr(_threads, "values", None) is not None


class RankLocal(Generic[T]):
    """A value per rank: the process's, or in a rank thread the thread's own.

    Args:
        initial: makes the starting value (for the process, and for each rank thread).
    """

    def __init__(self, initial: Callable[[], T]) -> None:
        self._initial = initial
        self._process_value = initial()

    def get(self) -> T:
        """This rank's value."""
        values: dict[RankLocal[Any], Any] | None = getattr(_threads, "values", None)
        if values is None:
            return self._process_value
        if self not in values:
            values[self] = self._initial()
        return values[self]  # type: ignore[no-any-return]

    def set(self, value: T) -> None:
        """Replace this rank's value."""
        values: dict[RankLocal[Any], Any] | None = getattr(_threads, "values", None)
        if values is None:
            self._process_value = value
        else:
            values[self] = value


class RankLocalDict:
    """A class attribute that is a ``dict`` per rank (the shared ``__dict__`` of a state class:
    every instance in one rank shares it, ranks that are threads of one process do not)."""

    def __init__(self) -> None:
        self._value: RankLocal[dict[str, Any]] = RankLocal(dict)

    def __get__(self, obj: object, owner: type | None = None) -> dict[str, Any]:
        return self._value.get()


class RoutedStream(io.TextIOBase):
    """``sys.stdout`` or ``sys.stderr`` of a process that runs several ranks: what a rank's
    thread writes goes to that rank's stream, what other threads write to the first rank's."""

    def __init__(self) -> None:
        super().__init__()
        self._streams: RankLocal[io.TextIOBase | None] = RankLocal(lambda: None)
        self._first: io.TextIOBase | None = None

    def attach(self, stream: io.TextIOBase) -> None:
        """Make ``stream`` the calling rank's."""
        self._streams.set(stream)
        if self._first is None:
            self._first = stream

    def _target(self) -> io.TextIOBase:
        stream = self._streams.get() or self._first
        if stream is None:
            raise ValueError("no rank's stream is attached yet")
        return stream

    @property
    def encoding(self) -> str:  # type: ignore[override]
        """The rank's stream's encoding."""
        return str(getattr(self._target(), "encoding", "utf-8"))

    def writable(self) -> bool:
        """Always writable."""
        return True

    def isatty(self) -> bool:
        """As the rank's stream says."""
        return self._target().isatty()

    def fileno(self) -> int:
        """The rank's stream's file descriptor."""
        return self._target().fileno()

    def write(self, text: str) -> int:
        """Write ``text`` to the writing rank's stream."""
        return self._target().write(text)

    def flush(self) -> None:
        """Flush the calling rank's stream."""
        self._target().flush()


def install_stream(name: Literal["stdout", "stderr"], stream: io.TextIOBase) -> None:
    """Make ``stream`` the calling rank's ``sys.stdout`` (or ``sys.stderr``): the stream
    itself in a process of one rank; in a rank thread, through one :class:`RoutedStream`
    shared by the process's ranks."""
    if not is_rank_thread():
        setattr(sys, name, stream)
        return
    with _install_lock:
        routed = getattr(sys, name)
        if not isinstance(routed, RoutedStream):
            routed = RoutedStream()
            setattr(sys, name, routed)
    routed.attach(stream)
