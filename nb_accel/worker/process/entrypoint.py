"""Worker main of a single-node launch: become a rank, join the process group, run the
function, report, exit (the steps every worker shares are in :mod:`.lifecycle`).

The same code runs for every start method: ``fork`` and ``forkserver`` call :func:`run_worker`
through ``multiprocessing``; ``spawn`` starts a fresh interpreter on :func:`spawn_main`.
"""

from __future__ import annotations

import os
import pickle
from datetime import timedelta
from functools import partial
from multiprocessing.connection import Connection
from typing import Any

import torch.distributed as dist

from ..._messages import Result
from ...runtime.device_types.group_backends import cpu_collectives_only
from ..debugging.deadline import stop_watching
from ..debugging.post_mortem import has_failure
from ..reporting.channel import EventChannel, current_channel
from . import rank_group
from .fd_forwarder import faulthandler_to_stderr
from .lifecycle import RankStart, await_post_mortem, live_as_rank, send_flushed
from .outcomes import deadline_failure, failure_event, result_event
from .rank_group import OwnDeadline, bound_device, leave_process_group, use_rank_device
from .regroup import (
    GroupOrigin,
    Settle,
    join_process_group,
    keep_root_store,
)
from .spec import WorkerArgs, unpack_payload
from .trainer_support import reached_by, set_up_training_arguments

__all__ = ["run_worker", "spawn_main", "failure_event", "result_event"]


def _report_timeout(
    channel: EventChannel, rank: int, message: str, where: str, stack: str, at_prompt: bool
) -> None:
    send_flushed(channel, deadline_failure(rank, message, where, stack, at_prompt))


def _init_process_group(args: WorkerArgs) -> None:
    use_rank_device(args.device_type, args.local_rank, args.local_world_size)
    timeout = timedelta(seconds=args.timeout_s)
    store = dist.FileStore(args.store_path, args.world_size)
    # The store keeps torch's own default (300 s) unless told: every wait on it (NCCL's
    # exchange of its communicator's id, the barrier below) must allow the launch's timeout.
    store.set_timeout(timeout)
    # The rank keeps the launch's collective timeout itself, time at the kernel's prompts
    # left out, where torch has a flight recorder to read.
    channel = current_channel()
    report = None if channel is None else partial(_report_timeout, channel, args.rank)
    deadline = OwnDeadline(args.timeout_s, args.prompt_clock, report)
    keep_root_store(store)  # a group made anew hangs from it, where a new rank finds it
    if args.joins_at >= 0:  # in place of a rank that died: the others make the group anew
        deadline.start()
        origin = GroupOrigin(store, args.backend, args.rank, args.world_size)
        join_process_group(origin, Settle(args.joins_at, args.timeout_s))
        return
    dist.init_process_group(
        args.backend,
        store=store,
        rank=args.rank,
        world_size=args.world_size,
        timeout=deadline.group_timeout(),
        device_id=bound_device(args.device_type, args.local_rank),
    )
    deadline.start()
    # A rank may leave init before its peers finished connecting to it; without this barrier
    # a rank that returns at once could close its sockets under a peer still connecting.
    if cpu_collectives_only(args.backend):
        dist.barrier()
        deadline.connected()
    else:
        if store.add("nb_accel/joined", 1) == args.world_size:
            store.set("nb_accel/ready", "1")
        store.wait(["nb_accel/ready"])


def _run_function(args: WorkerArgs) -> Any:
    function, fargs, fkwargs = unpack_payload(args.payload)
    _init_process_group(args)
    # 🤗 TrainingArguments made in the kernel: this rank's devices
    set_up_training_arguments(reached_by(function, fargs, fkwargs))
    return function(*fargs, **fkwargs)


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
    start = RankStart(args.rank, args.rank_environment(), parent_pid)
    channel, outcome = live_as_rank(
        start, lambda: conn, lambda: _run_function(args), own_files=(__file__, rank_group.__file__)
    )
    stop_watching()
    ok = isinstance(outcome, Result)
    if not ok and args.post_mortem_s > 0 and has_failure():
        await_post_mortem(channel, args.post_mortem_s)
    if ok:
        try:
            leave_process_group()
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
