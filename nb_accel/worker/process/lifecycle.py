"""One worker's life, the same for every kind of launch: become the rank, open the event
channel, run the function, finish what the function left open, report, and leave.

A worker main (a launch's :mod:`.entrypoint`, a node's :mod:`.node_worker`, an XLA device's
``worker.xla.main``) says only what differs: how it reaches its kernel, how it joins its
process group (inside the function it hands over), how it judges a failure and how it exits.
The rest happens here, in this order:

1. :func:`become_rank`: die with the parent, default signal handlers, out of the kernel's
   IPython shell, a process group of its own (so that stopping the launch reaches what the
   worker starts), the rank's environment, its stacks written on the kernel's request, every
   state object fresh, and a process group inherited from the kernel by fork forgotten.
2. :func:`open_channel`: the event channel, ``sys.stdout``/``sys.stderr`` relayed over it,
   plain tqdm bars and the 🤗 Trainer's logs as rows of the launch view, then ``Started``.
3. :func:`report_outcome`: the function's outcome, then, whatever it was, the trackers it left
   open finished (as failed after a failure), the streams and the progress reporter flushed,
   and the outcome sent; trackers and progress reach their files and the kernel before the
   outcome does, so the kernel never ends a launch ahead of them.

:func:`live_as_rank` runs the three; the worker main then exits its own way.
"""

from __future__ import annotations

import builtins
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from ..._messages import Event, Failure, Started
from ...runtime.rank_local import install_stream
from ...runtime.state import reset_all_states
from ...runtime.tracking.open_runs import finish_open_trackers
from ..debugging.breakpoints import DebuggerQuit, install_prompts, quit_explained
from ..debugging.post_mortem import keep_failure, wait_for_post_mortem
from ..reporting.channel import EventChannel, set_current_channel
from ..reporting.collective_trail import answer_collective_requests, enable_flight_recorder
from ..reporting.foreign_bars import report_plain_bars
from ..reporting.log_handlers import follow_streams
from ..reporting.relay import RelayStream
from ..reporting.reporter import flush_reporter
from ..reporting.sink import install_sink
from ..reporting.stacks import answer_stack_requests
from ..transfer.segments import share_dir
from .accelerate_env import forget_accelerate_state
from .outcomes import Outcome, failure_event, result_event
from .rank_group import forget_inherited_process_group
from .regroup import abort_for_failed_peer, let_go_of_process_group
from .trainer_support import support_trainer

__all__ = [
    "RankStart",
    "StopRequested",
    "await_post_mortem",
    "Explain",
    "become_rank",
    "open_channel",
    "report_outcome",
    "send_flushed",
    "live_as_rank",
    "die_with_parent",
    "reset_signal_handlers",
    "leave_the_kernel_shell",
]

#: How a worker main turns an exception of its function into the failure it reports, given
#: the files of the machinery whose frames lead the traceback.
Explain = Callable[[BaseException, tuple[str, ...]], Failure]


@dataclass(frozen=True)
class RankStart:
    """What a worker process needs to become its rank.

    Attributes:
        rank: the global rank.
        environment: variables describing the rank, set before any state object is made.
        parent_pid: the kernel's pid (the worker exits at once if it is already gone);
            ``None`` when the parent is not the kernel (torch's elastic agent).
        attempt: how many times a multi-node launch restarted its workers before these.
        own_signals: reset the signal handlers inherited from the kernel, and stop on
            SIGTERM by :class:`StopRequested` (not where several ranks share the process;
            only done in the process's main thread, which owns them).
        own_process_group: put the worker in a process group of its own.
        own_accelerate_state: forget Accelerate's process-wide state (which can describe
            one rank only: not where a process runs several).
    """

    rank: int
    environment: Mapping[str, str] = field(default_factory=dict)
    parent_pid: int | None = None
    attempt: int = 0
    own_signals: bool = True
    own_process_group: bool = True
    own_accelerate_state: bool = True


class StopRequested(BaseException):
    """Raised in a worker when its launch stops it (SIGTERM: another rank failed, the kernel
    was interrupted, the elastic agent tears the group down): the function unwinds, so that
    the trackers it left open are finished before the process ends. Nothing is reported for
    it: the kernel already knows why it stops the worker."""


def await_post_mortem(channel: EventChannel, limit_s: float) -> None:
    """After the launch's function raised here: let the process group go (the ranks waiting
    for this one fail at once), then wait up to ``limit_s`` for the kernel's ``%debug`` on
    these frames (:func:`~..debugging.post_mortem.wait_for_post_mortem`); the kernel's stop
    ends the wait."""
    try:
        let_go_of_process_group()
        wait_for_post_mortem(channel, limit_s)
    except StopRequested:  # the kernel let it go
        pass


#: The worker whose SIGTERM handler this is (a process the function forks inherits it).
_rank_pid: list[int] = []


def _stop_requested(signum: int, frame: object) -> None:
    if not _rank_pid or os.getpid() != _rank_pid[0]:  # a loader's worker, say: as by default
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: finishing is not cut short
    raise StopRequested


def reset_signal_handlers() -> None:
    """Undo Python-level signal handlers a forked worker inherited from the kernel; SIGTERM
    then raises :class:`StopRequested` in this process (and acts as by default in a process
    forked from it)."""
    for name in ("SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _rank_pid[:] = [os.getpid()]
    signal.signal(signal.SIGTERM, _stop_requested)


def _no_input(prompt: object = "") -> str:
    raise RuntimeError(
        "input() cannot be answered inside a distributed worker (nothing is typed there): "
        "ask in the kernel and pass the answer as an argument, or push it to the workers"
    )


def leave_the_kernel_shell() -> None:
    """A forked worker inherits the kernel's IPython shell, whose messages to the front end it
    cannot send (they would be dropped): forget the shell, so ``display()`` prints text that
    reaches the cell as output, and make ``input()`` fail at once instead of waiting forever."""
    builtins.input = _no_input
    shell_module = sys.modules.get("IPython.core.interactiveshell")
    shell_class = getattr(shell_module, "InteractiveShell", None)
    if shell_class is not None:
        shell_class.clear_instance()  # on every class of the chain that keeps the singleton


def die_with_parent(parent_pid: int | None) -> None:
    """Ask Linux to kill this process when its parent dies; exit now if ``parent_pid`` (the
    kernel) already has."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


def become_rank(start: RankStart) -> None:
    """Turn the process (a fork of the kernel or a fresh one) into rank ``start.rank``."""
    die_with_parent(start.parent_pid)
    if start.own_signals and threading.current_thread() is threading.main_thread():
        reset_signal_handlers()  # (only a process's main thread may set them)
    leave_the_kernel_shell()
    if start.own_process_group:
        try:
            os.setpgid(0, 0)  # stopping the launch reaches what this worker starts, too
        except OSError:
            pass
    os.environ.update(start.environment)
    enable_flight_recorder()  # before the process group: which collective each rank entered
    folder = share_dir()
    if (
        folder is not None
        and start.own_signals
        and threading.current_thread() is threading.main_thread()
    ):
        answer_stack_requests(folder, start.rank)  # where the rank is, when the kernel asks
    if folder is not None:
        answer_collective_requests(folder, start.rank, abort_for_failed_peer)
    reset_all_states()
    if start.own_accelerate_state:
        forget_accelerate_state()
    forget_inherited_process_group()


def open_channel(conn: Connection, start: RankStart) -> EventChannel:
    """The rank's event channel over ``conn``, with its output and progress relayed there;
    the kernel hears ``Started`` last."""
    channel = EventChannel(conn, start.rank)
    set_current_channel(channel)
    install_sink(channel)  # the library's way to the kernel
    install_prompts(channel)  # input() and breakpoints ask in the notebook, where it answers
    inherited = sys.stdout, sys.stderr
    install_stream("stdout", RelayStream(channel, "stdout", 1))
    install_stream("stderr", RelayStream(channel, "stderr", 2))
    moved = {id(old): new for old, new in zip(inherited, (sys.stdout, sys.stderr), strict=True)}
    follow_streams({key: new for key, new in moved.items() if key != id(new)})
    report_plain_bars()  # tqdm bars of every kind: rows of the launch view, not text
    support_trainer()  # 🤗 Trainer: logs in the live chart, tqdm progress
    channel.send(Started(start.rank, os.getpid(), start.attempt))
    return channel


def send_flushed(channel: EventChannel, event: Event) -> None:
    """Send ``event`` after what the rank printed and its progress (the bars' and metrics'
    final state), so that the kernel has them all when the event arrives."""
    sys.stdout.flush()
    sys.stderr.flush()
    flush_reporter()
    channel.send(event)


def _outcome(
    rank: int, function: Callable[[], Any], own_files: tuple[str, ...], explain: Explain | None
) -> Outcome:
    try:
        return result_event(rank, function())
    except StopRequested:
        raise
    except BaseException as exc:  # noqa: BLE001 - every failure is reported to the kernel
        exc = quit_explained(exc, rank)  # q typed at a breakpoint
        if not isinstance(exc, DebuggerQuit):
            keep_failure(0, exc)  # its frames, for a post-mortem
        files = (__file__, *own_files)
        return explain(exc, files) if explain is not None else failure_event(rank, exc, files)


def report_outcome(
    channel: EventChannel,
    function: Callable[[], Any],
    *,
    own_files: tuple[str, ...] = (),
    explain: Explain | None = None,
    settle: Callable[[Outcome], Outcome] | None = None,
) -> Outcome:
    """Run ``function`` as the channel's rank and report what it came to.

    Args:
        channel: the rank's event channel.
        function: the launch's function, with whatever joins the process group first.
        own_files: the worker main's files, left out of a failure's traceback.
        explain: makes the failure of an exception (by default the rank's own).
        settle: last word on the outcome before it is reported.

    Returns:
        The outcome, sent. Open trackers are finished on every way out, as failed unless
        the function's value is on its way to the kernel.

    Raises:
        StopRequested: the launch stopped the worker (its trackers are finished; nothing is
            sent).
    """
    failed = True
    try:
        outcome = _outcome(channel.rank, function, own_files, explain)
        if settle is not None:
            outcome = settle(outcome)
        failed = isinstance(outcome, Failure)
    finally:
        finish_open_trackers(failed=failed)  # their files complete before the outcome is sent
    send_flushed(channel, outcome)
    return outcome


def live_as_rank(
    start: RankStart,
    connect: Callable[[], Connection],
    function: Callable[[], Any],
    *,
    own_files: tuple[str, ...] = (),
    explain: Explain | None = None,
    settle: Callable[[Outcome], Outcome] | None = None,
) -> tuple[EventChannel, Outcome]:
    """Become the rank, connect to the kernel (``connect``, once the process is the rank's),
    run ``function`` and report its outcome (see :func:`report_outcome`); returns the channel
    and the outcome, for the worker main to leave its own way. A worker the launch stops
    (:class:`StopRequested`) ends here, once its trackers are finished."""
    become_rank(start)
    try:
        channel = open_channel(connect(), start)
        outcome = report_outcome(
            channel, function, own_files=own_files, explain=explain, settle=settle
        )
    except StopRequested:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(128 + signal.SIGTERM)
    return channel, outcome
