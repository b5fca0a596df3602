"""The collective a rank last entered, from torch's flight recorder, told on the kernel's request.

Torch's flight recorder keeps a ring of the last collectives each process group ran (its
sequence number, its op, and on NCCL whether it finished); workers turn it on
(:func:`enable_flight_recorder`) before their process group exists. A rank that times out in a
collective says which one in its failure (:func:`last_collective`). A rank that is still
running answers through a small thread: the kernel writes to the rank's request pipe
(:func:`request_file`) and the thread writes the answer file (:func:`answer_file`). A thread,
not a signal handler: Python runs signal handlers only in the main thread, between bytecodes,
never while it sits inside a collective.

The same thread aborts the rank's collectives when the kernel asks (:data:`ABORT`): an NCCL
rank that waits for a peer that failed is freed only by its own communicator's abort.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from ...runtime.device_types import device_types
from ...runtime.device_types.group_backends import backends_by_device

__all__ = [
    "collective_in_flight",
    "recorder_available",
    "ABORT",
    "ASK",
    "Abort",
    "FLIGHT_RECORDER_ENV",
    "LastCollective",
    "answer_collective_requests",
    "answer_file",
    "answer_once",
    "C10D_FILE",
    "POINT_TO_POINT",
    "collective_raised_in",
    "enable_flight_recorder",
    "last_collective",
    "request_file",
]

#: The variable that sizes torch's flight recorder (0, its default, turns it off).
FLIGHT_RECORDER_ENV = "TORCH_FR_BUFFER_SIZE"

#: The entries kept per process when the user did not choose: enough to see the last few
#: collectives, small enough to dump in milliseconds.
DEFAULT_ENTRIES = 200

#: A request for the last collective (answered in :func:`answer_file`).
ASK = b"?"
#: A request to abort the rank's collectives (the kernel saw it wait for a failed peer).
ABORT = b"!"

#: The process groups torch names by default (not worth saying).
_DEFAULT_GROUPS = frozenset({"default_pg", "undefined", ""})

#: torch's module of collectives, whose functions a waiting thread is inside.
C10D_FILE = os.path.join("torch", "distributed", "distributed_c10d.py")
#: Its blocking point-to-point functions (gloo does not record them in the flight recorder).
POINT_TO_POINT = frozenset({"send", "recv"})

#: Aborts this process's collectives, from a thread other than the one waiting in them.
Abort = Callable[[], None]


def _runs_detached(backend: str) -> bool:
    """Whether a group made as ``backend`` runs collectives apart from Python on a device type
    it serves (asked of the types by the backend alone: the kernel asks too)."""
    served = backends_by_device(backend)
    return any(d.detached_collectives(backend) for d in device_types() if d.name in served)


@dataclass(frozen=True)
class LastCollective:
    """The newest collective of a rank's flight recorder.

    Attributes:
        op: the operation (``"all_reduce"``).
        sequence: its number among the process group's collectives (1 is the first).
        group: the process group's name when it is not the default one, else ``""``.
        state: ``"completed"`` or ``"started"`` where the backend tracks it (NCCL), else
            ``"scheduled"`` (entered; gloo does not say more).
        point_to_point: whether it was a send or a receive (``sequence`` counts those).
        backend: the backend that ran it (``"gloo"``, ``"nccl"``).
        created_ns: when it was entered (``time.time_ns()``; 0: not known).
    """

    op: str
    sequence: int
    group: str = ""
    state: str = "scheduled"
    point_to_point: bool = False
    backend: str = ""
    created_ns: int = 0

    @property
    def waiting(self) -> bool:
        """Whether the rank is known to wait for it still. NCCL runs collectives apart from
        Python and says when they finish; a gloo rank waits inside its Python call, which its
        stack shows instead."""
        return self.state != "completed" and _runs_detached(self.backend)

    def describe(self) -> str:
        """``all_reduce #3``, with its group and whether it finished where that is known (a
        ``sequence`` of 0: its number is not known)."""
        text = f"{self.op} #{self.sequence}" if self.sequence > 0 else self.op
        if self.point_to_point:
            text += " (point-to-point)"
        if self.group:
            text += f" of group {self.group}"
        if self.state == "completed":
            text += ", finished"
        elif self.state == "started":
            text += ", not finished"
        return text

    @classmethod
    def from_json(cls, text: str) -> LastCollective | None:
        """The collective an answer file holds (``None``: none, or the file is not one)."""
        try:
            fields = json.loads(text)
            return cls(**fields) if isinstance(fields, dict) else None
        except (ValueError, TypeError):
            return None


def enable_flight_recorder() -> None:
    """Turn torch's flight recorder on for the process groups this process creates, unless the
    user sized it already (call before the first one)."""
    os.environ.setdefault(FLIGHT_RECORDER_ENV, str(DEFAULT_ENTRIES))


def _recorded_entries() -> list[dict[str, Any]]:
    """Every entry of torch's flight recorders in this process: the recorder of gloo and other
    backends, and NCCL's own (a separate one in CUDA builds of torch)."""
    try:
        from torch._C import _distributed_c10d as c10d  # type: ignore[attr-defined]
    except ImportError:
        return []
    entries: list[dict[str, Any]] = []
    for dump_name in ("_dump_fr_trace_json", "_dump_nccl_trace_json"):
        dump = getattr(c10d, dump_name, None)
        if dump is None:
            continue
        try:
            entries += json.loads(dump(True, False)).get("entries", [])
        except Exception:  # noqa: BLE001 - the trail is a hint; never fail a report over it
            continue
    return entries


def _described(entry: dict[str, Any]) -> LastCollective:
    point_to_point = bool(entry.get("is_p2p"))
    backend, _, op = str(entry.get("profiling_name", "collective")).rpartition(":")
    group = entry.get("process_group") or ["", ""]
    group_name = str(group[1]) if len(group) > 1 else ""
    return LastCollective(
        op=op,
        sequence=int(entry.get("p2p_seq_id" if point_to_point else "collective_seq_id", 0)),
        group="" if group_name in _DEFAULT_GROUPS else group_name,
        state=str(entry.get("state", "scheduled")),
        point_to_point=point_to_point,
        backend=backend,
        created_ns=int(entry.get("time_created_ns", 0)),
    )


def _newest(entries: list[dict[str, Any]]) -> dict[str, Any]:
    return max(entries, key=lambda e: (e.get("time_created_ns", 0), e.get("record_id", 0)))


def last_collective() -> LastCollective | None:
    """The newest collective this process entered, or ``None`` (no process group, the recorder
    off, or a torch without it)."""
    entries = _recorded_entries()
    return _described(_newest(entries)) if entries else None


def collective_raised_in(exc: BaseException) -> LastCollective | None:
    """The collective ``exc`` was raised in: a blocking ``send`` or ``recv`` where its
    traceback ends in one (the flight recorder has none of gloo's), else the newest the flight
    recorder has (``None``: neither known)."""
    tb, call = exc.__traceback__, ""
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename.endswith(C10D_FILE):
            call = code.co_name
        tb = tb.tb_next
    if call in POINT_TO_POINT:
        return LastCollective(op=call, sequence=0, point_to_point=True)
    return last_collective()


def recorder_available() -> bool:
    """Whether this torch has a flight recorder nb_accel can read."""
    try:
        from torch._C import _distributed_c10d as c10d  # type: ignore[attr-defined]
    except ImportError:
        return False
    return hasattr(c10d, "_dump_fr_trace_json")


def collective_in_flight() -> tuple[int, LastCollective] | None:
    """The newest collective of the default process group that has not finished (torch
    retires an entry once its work is done), with its record number; ``None`` when there is
    none."""
    pending = [
        e
        for e in _recorded_entries()
        if not e.get("retired", True)
        and str((e.get("process_group") or ["", ""])[-1]) in _DEFAULT_GROUPS
    ]
    if not pending:
        return None
    newest = _newest(pending)
    return int(newest.get("record_id", 0)), _described(newest)


def request_file(folder: str, rank: int) -> str:
    """The pipe the kernel writes to, in the launch's ``folder``, to ask rank ``rank``."""
    return os.path.join(folder, f"collective-request-{rank}")


def answer_file(folder: str, rank: int) -> str:
    """The file rank ``rank`` answers in (JSON of a :class:`LastCollective`, or ``null``)."""
    return os.path.join(folder, f"collective-{rank}.json")


def answer_collective_requests(folder: str, rank: int, abort: Abort | None = None) -> None:
    """From now on, answer the kernel's requests for this rank's last collective, and abort
    the rank's collectives with ``abort`` when asked (a daemon thread waits on
    :func:`request_file`)."""
    pipe = request_file(folder, rank)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(pipe)  # a rank run again in the same folder (the pool's restart)
    try:
        os.mkfifo(pipe, 0o600)
    except OSError:
        return  # no pipes here: the kernel will not find one, and says nothing
    threading.Thread(
        target=_answer_forever,
        args=(pipe, answer_file(folder, rank), abort),
        daemon=True,
        name="nb_accel-collective-trail",
    ).start()


def _answer_forever(pipe: str, answer: str, abort: Abort | None) -> None:
    while answer_once(pipe, answer, abort):
        pass


def answer_once(pipe: str, answer: str, abort: Abort | None = None) -> bool:
    """Wait for one request on ``pipe`` and carry it out: write the last collective to
    ``answer`` (:data:`ASK`), or call ``abort`` (:data:`ABORT`); ``False`` when no more can be
    answered (the launch's folder is gone)."""
    try:
        reader = os.open(pipe, os.O_RDONLY)  # blocks until the kernel asks
    except OSError:
        return False
    try:
        request = os.read(reader, 64)
    finally:
        os.close(reader)
    if ABORT in request:
        if abort is not None:
            with contextlib.suppress(Exception):  # the rank's own error will say what failed
                abort()
        return True
    found = last_collective()
    temporary = answer + ".part"
    try:
        with open(temporary, "w", encoding="utf-8") as stream:
            json.dump(asdict(found) if found else None, stream)
        os.replace(temporary, answer)
    except OSError:
        return False
    return True
