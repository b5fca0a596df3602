"""The messages between the kernel and its workers: the events a worker sends on the launch's
event channel (:func:`encode`, :func:`decode`), and what the kernel sends a worker (the
commands of a persistent worker, the answers to its prompts: :func:`encode_command`,
:func:`decode_command`). Messages between the kernel and a host's node process are in
:mod:`nb_accel.launch.hosts.protocol`."""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "Answer",
    "BarState",
    "CellDone",
    "Command",
    "Debug",
    "Execute",
    "Interrupt",
    "KernelMessage",
    "Pull",
    "Push",
    "Stop",
    "Event",
    "Failure",
    "Output",
    "Prompt",
    "Release",
    "Report",
    "Result",
    "Settle",
    "Started",
    "TrackerRun",
    "decode",
    "decode_command",
    "encode",
    "encode_command",
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
    """The function returned; ``data`` is the pickled return value."""

    rank: int
    data: bytes


@dataclass(frozen=True)
class Failure:
    """The function raised.

    ``data`` is the pickled exception, or ``None`` when it could not be pickled.
    ``is_timeout`` marks errors raised by a collective that timed out. ``host`` names the
    machine of a multi-node launch the rank ran on (empty on a single node). ``timeout_s`` is
    the collective timeout the function itself chose (``InitProcessGroupKwargs``), when it
    replaced the launch's. ``collective`` says, for a timeout, which collective the rank was in
    (``"all_reduce #3"``, from torch's flight recorder; empty when unknown).
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
    command raised (the worker lives on).
    """

    rank: int
    cell: int
    value: bytes | None = None
    value_repr: str | None = None
    failure: Failure | None = None


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
    (in the notebook's input box) and sends it back as an :class:`Answer`."""

    rank: int
    text: str


Event = Started | Output | Result | Failure | Report | CellDone | TrackerRun | Prompt


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
    """Kernel to worker: the line typed at a :class:`Prompt` (``None``: no more input, as at
    the end of a file)."""

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


def encode(event: Event) -> bytes:
    """Serialise an event for the channel."""
    return pickle.dumps(event, protocol=pickle.HIGHEST_PROTOCOL)


def decode(data: bytes) -> Event:
    """Inverse of :func:`encode`."""
    event = pickle.loads(data)
    if not isinstance(event, Event):
        raise TypeError(f"unexpected message on the event channel: {type(event).__name__}")
    return event


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
