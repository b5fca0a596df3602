"""Worker main of an XLA launch: what ``xmp.spawn`` runs on every XLA device.

The kernel (``nb_accel.launch.xla.launcher``) installs the launch's event pipe here with
:func:`set_launch_pipe`, and the pipes of its worker processes' file descriptors 1 and 2 in
``nb_accel.worker.process.process_fds``, and then starts the workers with
``xmp.spawn(..., start_method="fork")``, so every worker inherits them. A worker process first
makes its own pair its file descriptors 1 and 2 (once per process, by whichever of its rank
threads comes first), so that what the TPU runtime and other native code write there reaches
the kernel. A worker then lives as every worker does (``nb_accel.worker.process.lifecycle``):
it becomes its rank (the environment a launched worker has, ranks from the XLA runtime),
reports to the kernel (``Started``, output, progress, then ``Result`` or ``Failure``), and
finishes the trackers its function left open; when its function raised, it ends its process
at once so that torch_xla's process pool stops the other ranks instead of leaving them waiting
in a collective. Imported only on the XLA path.
"""

from __future__ import annotations

import os
from multiprocessing.connection import Connection
from typing import Any, cast

from ..._messages import Failure
from ...runtime.rank_local import become_rank_thread
from ...runtime.xla.device import devices_in_process, mark_step, world_size
from ..process.lifecycle import RankStart, live_as_rank
from ..process.process_fds import write_to_process_pipes
from ..process.returns import to_cpu
from ..transfer.pickling import loads

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


def _rank_start(rank: int, settings: dict[str, str], threads: int, kernel_pid: int) -> RankStart:
    """How the worker becomes rank ``rank`` (``threads``: ranks this process runs; with more
    than one, the process-wide ``RANK`` and ``LOCAL_RANK`` could name only one of them and are
    left out: ``PartialState`` names each rank; Accelerate's state and the signal handlers are
    the process's too, and left as they are; with one, they are the rank's, as in every launch,
    where it runs in the process's main thread)."""
    world = world_size()
    processes = int(os.environ.get("PJRT_LOCAL_PROCESS_COUNT", "1"))
    names = {"RANK": str(rank), "LOCAL_RANK": os.environ.get("PJRT_LOCAL_PROCESS_RANK", "0")}
    environment = {
        **(names if threads == 1 else {}),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(min(world, processes * threads)),
        "NB_ACCEL_LAUNCHED": "1",
        "NB_ACCEL_BACKEND": "xla",
        **settings,
    }
    return RankStart(
        rank,
        environment,
        kernel_pid,
        own_signals=threads == 1,
        own_accelerate_state=threads == 1,
    )


def _run_function(payload: bytes) -> Any:
    function, fargs, fkwargs = loads(payload)
    value = function(*fargs, **fkwargs)
    mark_step()
    return to_cpu(value)


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
    pipe = _pipe
    write_to_process_pipes(int(os.environ.get("PJRT_LOCAL_PROCESS_RANK") or 0))
    threads = devices_in_process()
    if threads > 1:  # TPU v2/v3: this process runs one rank per TensorCore, a thread each
        become_rank_thread()
    _, outcome = live_as_rank(
        _rank_start(rank, settings, threads, kernel_pid),
        lambda: cast(Connection, pipe),
        lambda: _run_function(payload),
        own_files=(__file__,),
    )
    if isinstance(outcome, Failure):
        os._exit(1)  # torch_xla's pool then stops the ranks that may wait for this one (and
        # this process's other rank threads)
