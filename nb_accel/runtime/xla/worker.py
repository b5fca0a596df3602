"""Worker main of an XLA launch: what ``xmp.spawn`` runs on every XLA device.

The kernel (``nb_accel.launch.xla.launcher``) installs the launch's event pipe here with
:func:`set_launch_pipe`, and the pipes of its worker processes' file descriptors 1 and 2 in
:mod:`.process_fds`, and then starts the workers with ``xmp.spawn(..., start_method="fork")``,
so every worker inherits them. A worker process first makes its own pair its file descriptors
1 and 2 (once per process, by whichever of its rank threads comes first), so that what the TPU
runtime and other native code write there reaches the kernel. A worker becomes its rank (the
environment a launched worker has, ranks from the XLA runtime), reports to the kernel like any
other worker (``Started``, output, progress, then ``Result`` or ``Failure``) and, when its
function raised, ends its process at once so that torch_xla's process pool stops the other
ranks instead of leaving them waiting in a collective. Imported only on the XLA path.
"""

from __future__ import annotations

import os
import sys
from multiprocessing.connection import Connection
from typing import Any, cast

import cloudpickle

from ..._messages import Failure, Result, Started
from ..rank_local import become_rank_thread, install_stream
from ..reporting.channel import EventChannel, set_current_channel
from ..reporting.foreign_bars import report_plain_bars
from ..reporting.relay import RelayStream
from ..reporting.reporter import flush_reporter
from ..state import reset_all_states
from ..workers.accelerate_env import forget_accelerate_state
from ..workers.entrypoint import (
    _die_with_parent,
    _forget_inherited_process_group,
    _leave_the_kernel_shell,
    failure_event,
    result_event,
    to_cpu,
)
from ..workers.process_fds import write_to_process_pipes
from ..workers.trainer_support import support_trainer
from .device import devices_in_process, mark_step, world_size

__all__ = ["SharedWriter", "set_launch_pipe", "run_xla_worker"]


class SharedWriter:
    """The write end of the launch's pipe, shared by every worker process: whole messages only.

    Args:
        conn: the pipe's write end.
        lock: a ``multiprocessing`` lock shared by the workers (inherited through fork).
    """

    def __init__(self, conn: Connection, lock: Any) -> None:
        self._conn = conn
        self._lock = lock

    def send_bytes(self, data: bytes) -> None:
        """Send one message; concurrent senders in other processes wait their turn."""
        with self._lock:
            self._conn.send_bytes(data)


_pipe: SharedWriter | None = None


def set_launch_pipe(writer: SharedWriter | None) -> None:
    """Install (or, with ``None``, forget) the pipe the next forked workers report through."""
    global _pipe  # noqa: PLW0603 - one launch at a time per kernel
    _pipe = writer


def _become_rank(rank: int, settings: dict[str, str], threads: int) -> None:
    """Describe the rank in the environment (``threads``: ranks this process runs; with more
    than one, the process-wide ``RANK`` and ``LOCAL_RANK`` could name only one of them and are
    left out: ``PartialState`` names each rank) and start its states afresh."""
    world = world_size()
    processes = int(os.environ.get("PJRT_LOCAL_PROCESS_COUNT", "1"))
    names = {"RANK": str(rank), "LOCAL_RANK": os.environ.get("PJRT_LOCAL_PROCESS_RANK", "0")}
    os.environ.update(
        {
            **(names if threads == 1 else {}),
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(min(world, processes * threads)),
            "NB_ACCEL_LAUNCHED": "1",
            "NB_ACCEL_BACKEND": "xla",
            **settings,
        }
    )
    reset_all_states()
    if threads == 1:  # Accelerate's state is the process's: it can describe one rank only
        forget_accelerate_state()
    _forget_inherited_process_group()


def _outcome(rank: int, payload: bytes) -> Result | Failure:
    try:
        function, fargs, fkwargs = cloudpickle.loads(payload)
        value = function(*fargs, **fkwargs)
        mark_step()
        value = to_cpu(value)
    except BaseException as exc:  # noqa: BLE001 - every failure is reported to the kernel
        return failure_event(rank, exc, (__file__,))
    return result_event(rank, value)


def run_xla_worker(rank: int, payload: bytes, settings: dict[str, str], kernel_pid: int) -> None:
    """Run the launch's function as XLA rank ``rank`` and report the outcome to the kernel.

    Args:
        rank: the global ordinal ``xmp.spawn`` passes.
        payload: the cloudpickled ``(function, args, kwargs)``.
        settings: environment variables for the worker (mixed precision, accumulation).
        kernel_pid: the kernel's pid; the worker never runs inside the kernel itself.
    """
    if os.getpid() == kernel_pid or _pipe is None:
        raise RuntimeError("an nb_accel XLA worker must run in a process forked by its launch")
    write_to_process_pipes(int(os.environ.get("PJRT_LOCAL_PROCESS_RANK") or 0))
    threads = devices_in_process()
    if threads > 1:  # TPU v2/v3: this process runs one rank per TensorCore, a thread each
        become_rank_thread()
    _die_with_parent(kernel_pid)
    _leave_the_kernel_shell()
    try:
        os.setpgid(0, 0)  # stopping the launch reaches what this worker starts, too
    except OSError:
        pass
    _become_rank(rank, settings, threads)
    channel = EventChannel(cast(Connection, _pipe), rank)
    set_current_channel(channel)
    install_stream("stdout", RelayStream(channel, "stdout", 1))
    install_stream("stderr", RelayStream(channel, "stderr", 2))
    report_plain_bars()  # tqdm bars of every kind: rows of the launch view, not text
    support_trainer()  # 🤗 Trainer: logs in the live chart, tqdm progress
    channel.send(Started(rank, os.getpid()))
    outcome = _outcome(rank, payload)
    sys.stdout.flush()
    sys.stderr.flush()
    flush_reporter()  # the bars' and metrics' final state arrives before the outcome
    channel.send(outcome)
    if isinstance(outcome, Failure):
        os._exit(1)  # torch_xla's pool then stops the ranks that may wait for this one (and
        # this process's other rank threads)
