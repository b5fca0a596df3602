"""The one catalogue of the messages that cross nb_accel's processes, a module per channel:

- :mod:`~nb_accel._messages.events`: worker to kernel, the events a worker sends on the
  launch's event channel (:func:`encode`, :func:`decode`);
- :mod:`~nb_accel._messages.commands`: kernel to worker, the commands of a persistent worker
  and the answers to a rank's prompts (:func:`encode_command`, :func:`decode_command`);
- :mod:`~nb_accel._messages.hosts`: kernel and a host's node process, over the ``ssh`` or
  ``srun`` channel (framed by :mod:`nb_accel.launch.hosts.protocol`);
- :mod:`~nb_accel._messages.nodes`: node to node, through the rendezvous store.

Every name is importable from here (``from nb_accel._messages import Started``)."""

from __future__ import annotations

from .commands import (
    Answer,
    Call,
    Command,
    Debug,
    Execute,
    Interrupt,
    KernelMessage,
    Pull,
    Push,
    Release,
    Settle,
    Stop,
    decode_command,
    encode_command,
)
from .events import (
    BarState,
    CellDone,
    Event,
    Failure,
    MetricPoint,
    Output,
    Prompt,
    Report,
    Result,
    Started,
    TrackerRun,
    decode,
    encode,
)
from .hosts import (
    AgentEnded,
    AgentRestarting,
    AskWorkers,
    Forwarded,
    FromNode,
    Hello,
    NodeJob,
    PromptState,
    SignalWorker,
    StopNode,
    ToNode,
    ToWorker,
    Versions,
    WorkersAnswer,
)
from .nodes import NodeCard

__all__ = [
    # worker -> kernel
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
    # kernel -> worker
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
    # kernel <-> a host's node process
    "AgentEnded",
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
    # node <-> node
    "NodeCard",
]
