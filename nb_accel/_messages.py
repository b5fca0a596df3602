"""Typed events that travel from a worker to the kernel over the launch's event channel."""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "BarState",
    "Event",
    "Failure",
    "Output",
    "Report",
    "Result",
    "Started",
    "decode",
    "encode",
]


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


@dataclass(frozen=True)
class BarState:
    """One progress bar (``nb_accel.tqdm``) as a worker last saw it.

    ``bar`` identifies the bar within its rank; ``level`` is its nesting depth (0: outermost);
    ``rate`` is in units per second (``None`` before it is known); ``postfix`` is the text
    ``set_postfix`` produced; ``closed`` is set once the bar is closed (``leave``: whether it
    should stay on screen after that).
    """

    bar: int
    level: int
    desc: str
    n: float
    total: float | None
    unit: str
    elapsed: float
    rate: float | None
    postfix: str
    closed: bool = False
    leave: bool = True


#: One logged point: ``(step or None, {metric name: value})``.
MetricPoint = tuple[int | None, dict[str, float]]


@dataclass(frozen=True)
class Report:
    """Progress and metrics from one rank since its previous report (sent at most about ten
    times a second; the last one when the function ends). ``time`` is the worker's clock."""

    rank: int
    bars: tuple[BarState, ...]
    metrics: tuple[MetricPoint, ...]
    time: float


Event = Started | Output | Result | Failure | Report


def encode(event: Event) -> bytes:
    """Serialise an event for the channel."""
    return pickle.dumps(event, protocol=pickle.HIGHEST_PROTOCOL)


def decode(data: bytes) -> Event:
    """Inverse of :func:`encode`."""
    event = pickle.loads(data)
    if not isinstance(event, (Started, Output, Result, Failure, Report)):
        raise TypeError(f"unexpected message on the event channel: {type(event).__name__}")
    return event
