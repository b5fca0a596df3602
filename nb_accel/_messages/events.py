"""Worker to kernel: the events a worker sends on the launch's event channel (its result or
failure, its output, progress and metrics, its prompts), one pickled frame each
(:func:`encode`, :func:`decode`). A host's node process forwards these frames unread
(:class:`~nb_accel._messages.hosts.Forwarded`)."""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "BarState",
    "CellDone",
    "Event",
    "Failure",
    "MetricPoint",
    "Output",
    "Prompt",
    "Report",
    "Result",
    "Started",
    "TrackerRun",
    "decode",
    "encode",
]


@dataclass(frozen=True)
class Started:
    """The worker is up and about to join the process group (``attempt``: how many times a
    multi-node launch restarted its workers before this one)."""

    rank: int
    pid: int
    attempt: int = 0


@dataclass(frozen=True)
class Output:
    """Text the worker wrote to ``sys.stdout`` or ``sys.stderr``; ``debugger``: written by the
    rank's debugger (shown whichever ranks' output a cell shows)."""

    rank: int
    stream: Literal["stdout", "stderr"]
    text: str
    debugger: bool = False


@dataclass(frozen=True)
class Result:
    """The function returned; ``data`` is the pickled return value. ``at``: when, by the
    worker's clock (``time.time()``; 0: unknown)."""

    rank: int
    data: bytes
    at: float = 0.0


@dataclass(frozen=True)
class Failure:
    """The function raised.

    ``data`` is the pickled exception, or ``None`` when it could not be pickled.
    ``is_timeout`` marks errors raised by a collective that timed out. ``host`` names the
    machine of a multi-node launch the rank ran on (empty on a single node). ``timeout_s`` is
    the collective timeout the function itself chose (``InitProcessGroupKwargs``), when it
    replaced the launch's. ``collective`` says, for a timeout, which collective the rank was in
    (``"all_reduce #3"``, from torch's flight recorder; empty when unknown). ``at_prompt``: for
    a timeout the rank's own deadline found, whether one of the kernel's prompts (a rank's
    debugger or ``input()``) was open then, as the rank's prompt clock said. ``signal_name``
    and ``exitcode``: for a worker that died without reporting, as its node's agent saw it and
    relayed it to the other nodes (``type_name`` is then ``"signal"`` or ``"exit"``). ``at``:
    when it was found, by the worker's clock (``time.time()``; 0: unknown).
    """

    rank: int
    type_name: str
    message: str
    traceback: str
    data: bytes | None
    is_timeout: bool = False
    host: str = ""
    timeout_s: float | None = None
    collective: str = ""
    at_prompt: bool = False
    signal_name: str = ""
    exitcode: int | None = None
    at: float = 0.0


@dataclass(frozen=True)
class BarState:
    """One progress bar (``nb_accel.tqdm``, or any tqdm bar in a worker) as a worker last saw
    it: the fields of the bar's ``format_dict`` that tqdm's ``format_meter`` writes its text
    from, so that the kernel shows the text tqdm itself would.

    ``bar`` identifies the bar within its rank; ``level`` is its nesting depth (0: outermost);
    ``desc`` is tqdm's ``prefix``; ``n`` and ``total`` are the bar's own numbers (an ``int``
    stays an ``int``, as tqdm writes it); ``rate`` is in units per second (``None`` before it
    is known); ``postfix`` is the text ``set_postfix`` produced; ``closed`` is set once the bar
    is closed (``leave``: whether it should stay on screen after that). ``unit_scale``,
    ``unit_divisor``, ``bar_format``, ``initial`` and ``ascii`` are the bar's arguments of
    those names.
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
    unit_scale: bool | float = False
    unit_divisor: float = 1000
    bar_format: str | None = None
    initial: float = 0
    ascii: bool | str = False


#: One logged point: ``(step or None, {metric name: value})``.
MetricPoint = tuple[int | None, dict[str, float]]


@dataclass(frozen=True)
class Report:
    """Progress and metrics from one rank since its previous report (sent at most about ten
    times a second; the last one when the function ends). ``time`` is the worker's clock.
    ``notes`` are lines the launch view keeps on show (where each experiment tracker writes).
    """

    rank: int
    bars: tuple[BarState, ...]
    metrics: tuple[MetricPoint, ...]
    time: float
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class CellDone:
    """A persistent worker finished a command of cell ``cell``.

    ``value`` is the pickled value asked for (a cell's last expression, a pulled variable),
    ``value_repr`` its ``repr`` when it could not be pickled; ``failure`` is set when the
    command raised (the worker lives on). ``at``: when, by the worker's clock
    (``time.time()``; 0: unknown).
    """

    rank: int
    cell: int
    value: bytes | None = None
    value_repr: str | None = None
    failure: Failure | None = None
    at: float = 0.0

    @property
    def when(self) -> float:
        """When the command ended, by the worker's clock (its failure's time, where it
        failed; 0: unknown)."""
        if self.failure is not None and self.failure.at:
            return self.failure.at
        return self.at


@dataclass(frozen=True)
class TrackerRun:
    """A tracker of the rank opened a run (``open``), or ended it, that the kernel can end
    itself when the rank is stopped before it can: ``tracker`` is the tracker's name
    (``"mlflow"``), ``run_id`` the run and ``location`` where it is kept (MLflow's tracking
    URI)."""

    rank: int
    tracker: str
    run_id: str
    location: str
    open: bool = True


@dataclass(frozen=True)
class Prompt:
    """The rank's debugger waits for a line: the kernel asks for it with ``text`` as the prompt
    (in the notebook's input box) and sends it back as an :class:`Answer`. ``debugger``: pdb's
    prompt (else ``input()``'s); ``where``: the frame the rank waits in, as ``(file, line,
    function)`` (pdb's current frame, or the caller of ``input()``), when known."""

    rank: int
    text: str
    debugger: bool = False
    where: tuple[str, int, str] | None = None


Event = Started | Output | Result | Failure | Report | CellDone | TrackerRun | Prompt


def encode(event: Event) -> bytes:
    """Serialise an event for the channel."""
    return pickle.dumps(event, protocol=pickle.HIGHEST_PROTOCOL)


def decode(data: bytes) -> Event:
    """Inverse of :func:`encode`."""
    event = pickle.loads(data)
    if not isinstance(event, Event):
        raise TypeError(f"unexpected message on the event channel: {type(event).__name__}")
    return event
