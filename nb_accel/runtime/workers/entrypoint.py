"""Worker main: become a rank, join the process group, run the function, report, exit.

The same code runs for every start method: ``fork`` and ``forkserver`` call :func:`run_worker`
through ``multiprocessing``; ``spawn`` starts a fresh interpreter on :func:`spawn_main`.
"""

from __future__ import annotations

import builtins
import ctypes
import os
import pickle
import signal
import sys
import traceback
from datetime import timedelta
from multiprocessing.connection import Connection
from types import TracebackType
from typing import Any

import cloudpickle
import torch
import torch.distributed as dist

from ..._messages import Failure, Result, Started
from ..process_group import applied_timeout_s
from ..reporting.channel import EventChannel, set_current_channel
from ..reporting.foreign_bars import report_plain_bars
from ..reporting.relay import RelayStream
from ..reporting.reporter import flush_reporter
from ..state import reset_all_states
from ..tracking.open_runs import finish_open_trackers
from ..tree import recursively_apply
from .accelerate_env import export_thread_count, forget_accelerate_state
from .fd_forwarder import faulthandler_to_stderr
from .returns import check_returnable, dumps_result
from .spec import WorkerArgs
from .trainer_support import set_up_training_arguments, support_trainer

__all__ = [
    "run_worker",
    "spawn_main",
    "dumps_value",
    "failure_event",
    "result_event",
    "is_timeout_error",
    "nccl_device",
]

_TIMEOUT_MARKERS = ("timed out", "timeout", "time out")
#: Texts of a backend that failed to connect to its peers (gloo's "timed out connecting:
#: Connection refused"): a network problem, not a collective that waited too long.
_CONNECT_MARKERS = ("timed out connecting", "connection refused", "connectfullmesh")

#: Process-group objects this worker never destroys: those inherited from the kernel by fork
#: (their destructors would join threads that do not exist in the child), and its own group
#: once unregistered at exit (its destructor waits ~20 ms for backend threads; the process exit
#: that follows at once releases every socket anyway).
_kept_alive: list[object] = []


def _reset_signal_handlers() -> None:
    """Undo Python-level signal handlers a forked worker inherited from the kernel."""
    for name in ("SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _no_input(prompt: object = "") -> str:
    raise RuntimeError(
        "input() cannot be answered inside a distributed worker (nothing is typed there): "
        "ask in the kernel and pass the answer as an argument, or push it to the workers"
    )


def _leave_the_kernel_shell() -> None:
    """A forked worker inherits the kernel's IPython shell, whose messages to the front end it
    cannot send (they would be dropped): forget the shell, so ``display()`` prints text that
    reaches the cell as output, and make ``input()`` fail at once instead of waiting forever."""
    builtins.input = _no_input
    shell_module = sys.modules.get("IPython.core.interactiveshell")
    shell_class = getattr(shell_module, "InteractiveShell", None)
    if shell_class is not None and shell_class.initialized():
        for klass in shell_class.__mro__:  # the singleton is kept on every class of the chain
            if "_instance" in vars(klass):
                klass._instance = None


def _die_with_parent(parent_pid: int | None) -> None:
    """Ask Linux to kill this process when the kernel dies; exit now if it already has."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


def _forget_inherited_process_group() -> None:
    """Drop a process group a forked worker inherited from the kernel, without touching it."""
    if not dist.is_available() or not dist.is_initialized():
        return
    from torch.distributed import distributed_c10d as c10d

    _kept_alive.append(c10d._world)
    c10d._world = c10d._World()


def _leaf_to_cpu(value: Any) -> Any:
    if isinstance(value, torch.nn.parallel.DistributedDataParallel):
        value = value.module
    if isinstance(value, torch.nn.Module):
        return value.to("cpu")
    return value if value.device.type == "cpu" else value.detach().cpu()


def to_cpu(value: Any) -> Any:
    """Move tensors and modules in ``value`` to the CPU (lists, tuples, dicts, nesting)."""
    return recursively_apply(
        _leaf_to_cpu, value, test_type=lambda x: isinstance(x, (torch.Tensor, torch.nn.Module))
    )


def dumps_value(value: Any) -> bytes:
    """Pickle by reference where possible (keeps class identity), else by value."""
    try:
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(data)
        return data
    except Exception:  # noqa: BLE001 - any failure here is reported, never raised
        return cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def is_timeout_error(exc: BaseException) -> bool:
    """True for errors raised by a collective that exceeded the launch's timeout (a backend
    that could not even connect to its peers, "timed out connecting", is not one)."""
    text = str(exc).lower()
    if any(marker in text for marker in _CONNECT_MARKERS):
        return False
    return any(marker in text for marker in _TIMEOUT_MARKERS) and (
        isinstance(exc, (RuntimeError, dist.DistError)) or "Dist" in type(exc).__name__
    )


def _user_traceback(exc: BaseException, own_files: tuple[str, ...]) -> str:
    """The exception's traceback without the leading frames of ``own_files``."""
    tb: TracebackType | None = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in own_files:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def failure_event(rank: int, exc: BaseException, own_files: tuple[str, ...] = ()) -> Failure:
    """The :class:`Failure` event for ``exc`` on ``rank``; the traceback leaves out the
    leading frames of this module and of ``own_files`` (the worker's machinery)."""
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - any failure here is reported, never raised
        message = f"<str() of {type(exc).__name__} failed>"
    try:
        data: bytes | None = dumps_result(exc)
    except Exception:  # noqa: BLE001 - any failure here is reported, never raised
        data = None
    timed_out = is_timeout_error(exc)
    return Failure(
        rank=rank,
        type_name=f"{type(exc).__module__}.{type(exc).__qualname__}",
        message=message,
        traceback=_user_traceback(exc, (__file__, *own_files)),
        data=data,
        is_timeout=timed_out,
        timeout_s=applied_timeout_s() if timed_out else None,
    )


def nccl_device(backend: str, local_rank: int) -> torch.device | None:
    """The GPU an NCCL process group is bound to (``None`` for other backends).

    Bound, the group builds its communicator while the process group is made, when every rank
    arrives together, rather than at the first collective, where a rank that is late (rank 0
    downloading a model in ``main_process_first()``) could outlast the wait for it.
    """
    return torch.device("cuda", local_rank) if "nccl" in backend else None


def _init_process_group(args: WorkerArgs) -> None:
    if args.device_type == "cuda":
        torch.cuda.set_device(args.local_rank)
    elif "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.local_world_size))
        export_thread_count()
    timeout = timedelta(seconds=args.timeout_s)
    store = dist.FileStore(args.store_path, args.world_size)
    # The store keeps torch's own default (300 s) unless told: every wait on it (NCCL's
    # exchange of its communicator's id, the barrier below) must allow the launch's timeout.
    store.set_timeout(timeout)
    dist.init_process_group(
        args.backend,
        store=store,
        rank=args.rank,
        world_size=args.world_size,
        timeout=timeout,
        device_id=nccl_device(args.backend, args.local_rank),
    )
    # A rank may leave init before its peers finished connecting to it; without this barrier
    # a rank that returns at once could close its sockets under a peer still connecting.
    if args.backend == "gloo":
        dist.barrier()
    else:
        if store.add("nb_accel/joined", 1) == args.world_size:
            store.set("nb_accel/ready", "1")
        store.wait(["nb_accel/ready"])


def _run_function(args: WorkerArgs) -> Any:
    function, fargs, fkwargs = cloudpickle.loads(args.payload)
    _init_process_group(args)
    set_up_training_arguments()  # 🤗 TrainingArguments made in the kernel: this rank's devices
    return function(*fargs, **fkwargs)


def result_event(rank: int, value: Any) -> Result | Failure:
    """The event that sends ``value``, rank ``rank``'s return value, to the kernel (every
    tensor in it on the CPU), or a :class:`Failure` saying why it cannot travel."""
    try:
        check_returnable(value)
    except TypeError as refused:
        return failure_event(rank, refused)
    try:
        return Result(rank, dumps_result(value))
    except Exception as exc:  # noqa: BLE001 - reported to the kernel
        error = TypeError(
            f"rank {rank} returned a {type(value).__name__} that cannot be sent back to the "
            f"kernel ({exc}); return plain data (numbers, tensors, lists, dicts) "
            "or save it to a file"
        )
        return failure_event(rank, error)


def _write_to(output: tuple[Connection, Connection] | None) -> None:
    """Make ``output`` (the write ends of the kernel's pipes) this process's file descriptors
    1 and 2: what libraries, programs started from here and ``os.write`` put there reaches
    the kernel."""
    if output is None:
        return
    for target, end in zip((1, 2), output, strict=True):
        os.dup2(end.fileno(), target)
        end.close()
    faulthandler_to_stderr()


def run_worker(
    conn: Connection,
    args: WorkerArgs,
    parent_pid: int | None,
    output: tuple[Connection, Connection] | None = None,
) -> None:
    """Run one launch's function as rank ``args.rank`` and exit the process.

    ``output``: the pipes to make file descriptors 1 and 2 (a forked worker's; a spawned
    worker is started with them in place).

    Never returns: the process ends with ``os._exit`` (0 on success, 1 on failure) so that no
    inherited exit handler of the kernel runs in the worker.
    """
    _write_to(output)
    _die_with_parent(parent_pid)
    _reset_signal_handlers()
    _leave_the_kernel_shell()
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    os.environ.update(args.rank_environment())
    reset_all_states()
    forget_accelerate_state()
    _forget_inherited_process_group()
    channel = EventChannel(conn, args.rank)
    set_current_channel(channel)
    sys.stdout = RelayStream(channel, "stdout", 1)
    sys.stderr = RelayStream(channel, "stderr", 2)
    report_plain_bars()  # tqdm bars of every kind: rows of the launch view, not text
    support_trainer()  # 🤗 Trainer: logs in the live chart, tqdm progress
    channel.send(Started(args.rank, os.getpid()))
    ok = False
    try:
        outcome: Result | Failure = result_event(args.rank, _run_function(args))
    except BaseException as exc:  # noqa: BLE001 - every failure is reported to the kernel
        outcome = failure_event(args.rank, exc)
    ok = isinstance(outcome, Result)
    finish_open_trackers(failed=not ok)  # runs left open: their files complete before the outcome
    sys.stdout.flush()
    sys.stderr.flush()
    flush_reporter()  # the bars' and metrics' final state arrives before the outcome
    channel.send(outcome)
    if ok and dist.is_initialized():
        _kept_alive.append(dist.group.WORLD)
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - any failure here is reported, never raised
            ok = False
    channel.close()
    os._exit(0 if ok else 1)


def spawn_main() -> None:
    """Entry of a spawned worker: read its :class:`WorkerArgs` from the inherited connection."""
    fd = int(os.environ.pop("NB_ACCEL_CHANNEL_FD"))
    parent_pid = int(os.environ.pop("NB_ACCEL_PARENT_PID"))
    conn = Connection(fd)
    args = pickle.loads(conn.recv_bytes())
    if not isinstance(args, WorkerArgs):
        raise TypeError("nb_accel worker received unexpected start-up data")
    run_worker(conn, args, parent_pid)
