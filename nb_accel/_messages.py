"""Typed events that travel from a worker to the kernel over the launch's event channel."""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Literal

__all__ = ["Started", "Output", "Result", "Failure", "Event", "encode", "decode"]


@dataclass(frozen=True)
class Started:
    """The worker is up and about to join the process group."""

    rank: int
    pid: int


@dataclass(frozen=True)
class Output:
    """Text the worker wrote to ``sys.stdout`` or ``sys.stderr``."""

    rank: int
    stream: Literal["stdout", "stderr"]
    text: str


@dataclass(frozen=True)
class Result:
    """The function returned; ``data`` is the pickled return value."""

    rank: int
    data: bytes


@dataclass(frozen=True)
class Failure:
    """The function raised.

    ``data`` is the pickled exception, or ``None`` when it could not be pickled.
    ``is_timeout`` marks errors raised by a collective that timed out.
    """

    rank: int
    type_name: str
    message: str
    traceback: str
    data: bytes | None
    is_timeout: bool = False


Event = Started | Output | Result | Failure


def encode(event: Event) -> bytes:
    """Serialise an event for the channel."""
    return pickle.dumps(event, protocol=pickle.HIGHEST_PROTOCOL)


def decode(data: bytes) -> Event:
    """Inverse of :func:`encode`."""
    event = pickle.loads(data)
    if not isinstance(event, (Started, Output, Result, Failure)):
        raise TypeError(f"unexpected message on the event channel: {type(event).__name__}")
    return event
