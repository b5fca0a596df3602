"""A host's node process: started by the kernel over SSH or ``srun``
(``python -m nb_accel.launch.hosts.remote_node``), it runs torch's elastic agent for this
host's ranks and sends everything back over its standard output.

It says hello (versions, a free port), takes the :class:`~nb_accel._messages.NodeJob`, meets
the other hosts at the c10d rendezvous and runs the workers as a multi-node launch does; every
frame a worker sends is forwarded to the kernel unread, so the kernel judges the launch as a
whole. A :class:`~nb_accel._messages.StopNode`, or the end of the channel (the kernel stopped,
died, or the connection dropped), stops the agent, which stops the workers; a node whose agent
does not end soon after (inside a call to a store that a host cut off holds) stops them
itself and ends.

While its workers run it keeps the prompt clock they read (the kernel says when its prompts
open and close, :class:`~nb_accel._messages.PromptState`), so that time at a prompt leaves
their collective timeout.

For a pool spread over hosts the kernel also writes to its workers through this process
(:class:`~nb_accel._messages.ToWorker`), has it signal them
(:class:`~nb_accel._messages.SignalWorker`: the kernel's interrupt) and asks it what only this
host can see (:class:`~nb_accel._messages.AskWorkers`: their stacks, their memory).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import itertools
import os
import secrets
import shutil
import signal
import socket
import struct
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any

from ..._messages import (
    AgentEnded,
    AgentRestarting,
    Alive,
    AskWorkers,
    Forwarded,
    NodeJob,
    PromptState,
    SignalWorker,
    StopNode,
    ToWorker,
    TrackerRun,
    WorkersAnswer,
    decode,
)
from ...errors import LaunchError
from ...worker.debugging.prompt_clock import CLOCK_FILE, CLOCK_VARIABLE, PromptClock
from ..failures.whereabouts import abort_collectives, take_stacks
from ..launchers.left_open_runs import OpenRuns, end_runs_left_open
from ..multinode.launcher import agent_run
from ..multinode.node_events import WorkerListener
from ..multinode.unreaped import child_pids, stop_children
from ..processes import process_frozen, resident_mb
from ..scratch import make_scratch_dir
from .protocol import ALIVE_EVERY_S, hello, receive, send, stdio_channel

__all__ = ["main"]


def _peer_pid(conn: Connection) -> int | None:
    """The pid of the process at the other end of ``conn`` (a Unix socket)."""
    try:
        with socket.socket(fileno=os.dup(conn.fileno())) as sock:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    pid: int = struct.unpack("3i", creds)[0]
    return pid


class _Forwarder(WorkerListener):
    """Sends each worker's frames to the kernel as they come, numbering the connections; the
    kernel names a worker by its number when it writes to it.

    It reads one kind of frame itself: a worker's word that it opened or ended a tracker run
    (:class:`TrackerRun`). A run a stopped worker left open may be kept on this host only (an
    MLflow folder), out of the kernel's reach; the node ends it once its workers are gone.
    """

    def __init__(self, writer: Connection, lock: threading.Lock, authkey: bytes) -> None:
        super().__init__(authkey)
        self._writer = writer
        self._write_lock = lock
        self._numbers: dict[Connection, int] = {}
        self._by_number: dict[int, tuple[Connection, int | None]] = {}
        self._count = itertools.count()
        #: The tracker runs the workers opened and have not said they ended.
        self.open_runs = OpenRuns()
        self.listen()

    def on_frame(self, data: bytes, conn: Connection) -> None:
        """Forward it."""
        number = self._numbers.get(conn)
        if number is None:
            number = self._numbers[conn] = next(self._count)
            self._by_number[number] = (conn, _peer_pid(conn))
        if len(data) <= _RUN_FRAME_MAX and TrackerRun.__name__.encode() in data:
            self._note_run(data)
        with self._write_lock, contextlib.suppress(OSError):  # the kernel has gone
            send(self._writer, Forwarded(number, data))

    def _note_run(self, data: bytes) -> None:
        event = decode(data)
        if isinstance(event, TrackerRun):
            self.open_runs.note(event)

    def write(self, number: int, data: bytes) -> None:
        """Write ``data`` to connection ``number`` (unless that worker has gone)."""
        known = self._by_number.get(number)
        if known is not None:
            with contextlib.suppress(OSError):
                known[0].send_bytes(data)

    def pid_of(self, number: int) -> int | None:
        """The pid of the worker at the other end of connection ``number``."""
        known = self._by_number.get(number)
        return known[1] if known is not None else None


#: Set while the agent runs: only then does a stop request end it (afterwards this process is
#: sending its last words, and ends by itself).
_agent_running = threading.Event()
#: Set once the kernel asked this node to stop (an agent not started yet then never starts).
_stopping = threading.Event()
#: Set once this node's workers are done and its agent waits for the other hosts' (torch's
#: exit barrier, which no signal ends): a stop request then ends this process at once.
_at_exit_barrier = threading.Event()
#: Set once the agent's run returned (how it ended is being said).
_agent_returned = threading.Event()
#: Held by whichever says how this node ended: the main thread once its agent returned, or the
#: watcher ending the process without it (see _end_now); the other then leaves it be.
_ending = threading.Lock()
#: A frame this size or smaller may be a worker's word about a tracker run (see _Forwarder).
_RUN_FRAME_MAX = 4096
#: How long a node told to stop gives its agent to end (it stops the workers as every launch
#: does) before the node stops them itself and ends: an agent inside a call to the rendezvous
#: store of a host cut off the network hears no signal until that call gives up.
NODE_STOP_S = 2.0


class _Host:
    """What this node process holds while its workers run: their listener, its folder, the
    prompt clock in it, and the channel to the kernel (written under ``lock``)."""

    def __init__(self, writer: Connection, lock: threading.Lock) -> None:
        self.writer = writer
        self.lock = lock
        self.authkey = secrets.token_bytes(32)
        self.forwarder = _Forwarder(writer, lock, self.authkey)
        self.folder = make_scratch_dir("nodes")
        self.clock = PromptClock(os.path.join(self.folder, CLOCK_FILE))

    def answer(self, question: AskWorkers) -> None:
        """Answer ``question`` about this host's workers (see :class:`AskWorkers`)."""
        pids = {
            rank: pid
            for rank, sender in question.senders.items()
            if (pid := self.forwarder.pid_of(sender)) is not None
        }
        if question.what == "abort":
            abort_collectives(self.folder, sorted(pids))
            return
        value: dict[int, Any]
        if question.what == "memory":
            value = {rank: resident_mb(pid) for rank, pid in pids.items()}
        elif question.what == "frozen":
            value = {rank: process_frozen(pid) for rank, pid in pids.items()}
        else:  # a frozen worker cannot say where it is: not asked
            collectives = question.what == "where+collectives"
            thawed = {rank: pid for rank, pid in pids.items() if not process_frozen(pid)}
            value = dict(take_stacks(self.folder, thawed, question.wait_s, collectives))
        with self.lock, contextlib.suppress(OSError):
            send(self.writer, WorkersAnswer(question.request, value))

    def restarting(self, attempt: int, died: list[tuple[int, int, int]]) -> None:
        """Tell the kernel that the agent restarts the workers (see :class:`AgentRestarting`)."""
        with self.lock, contextlib.suppress(OSError):
            send(self.writer, AgentRestarting(attempt, died))

    def close(self) -> None:
        """Stop listening and remove the folder."""
        self.forwarder.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def _watch_kernel(reader: Connection, host: _Host) -> None:
    """Pass the kernel's words on to the workers; stop this node's agent (SIGTERM: it stops
    its workers) on :class:`StopNode` or at the end of the channel; end this process if the
    agent has not ended :data:`NODE_STOP_S` later."""
    while True:
        try:
            message = receive(reader)
        except (EOFError, OSError):
            break
        if isinstance(message, StopNode):
            break
        if isinstance(message, ToWorker):
            host.forwarder.write(message.sender, message.data)
        elif isinstance(message, PromptState):
            host.clock.set_open(message.is_open)
        elif isinstance(message, SignalWorker):
            pid = host.forwarder.pid_of(message.sender)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, message.signum)
        elif isinstance(message, AskWorkers):  # stacks take a while: the channel stays heard
            threading.Thread(target=host.answer, args=(message,), daemon=True).start()
    _stopping.set()
    if _at_exit_barrier.is_set():
        _end_now(host)
    if _agent_running.is_set():
        os.kill(os.getpid(), signal.SIGTERM)
        if not _agent_returned.wait(NODE_STOP_S):
            _end_now(host)


def _end_now(host: _Host) -> None:
    """End this process now, whatever its agent waits on (unless the agent just returned and
    the main thread says so): stop the workers still running (none at the exit barrier: they
    ran to their end), remove the folder, end the runs they left open, say the agent was
    stopped, exit without waiting for the other hosts."""
    if not _ending.acquire(blocking=False):
        return
    stop_children(sorted(child_pids()))
    host.close()
    _say_ended(host, AgentEnded(stopped=True))
    os._exit(0)


def _say_ended(host: _Host, ended: AgentEnded) -> None:
    """Tell the kernel how the agent ended, once the runs the workers left open are ended
    (the workers are gone), with what was said of them."""
    notes: list[str] = []
    end_runs_left_open(host.forwarder.open_runs.values(), say=notes.append)
    with host.lock, contextlib.suppress(OSError):
        send(host.writer, dataclasses.replace(ended, notes=tuple(notes)))


def _say_alive(host: _Host, done: threading.Event) -> None:
    """Tell the kernel this node is alive every :data:`ALIVE_EVERY_S` until ``done``."""
    while not done.is_set():
        with host.lock, contextlib.suppress(OSError):
            send(host.writer, Alive())
        done.wait(ALIVE_EVERY_S)


def _run(job: NodeJob, host: _Host) -> AgentEnded:
    """Run this node's agent for ``job``; how it ended."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    plan, nodes = job.plan, job.nodes
    forwarder, log_dir = host.forwarder, host.folder
    env = {**job.env, CLOCK_VARIABLE: host.clock.path}  # the workers keep their own deadline
    try:
        run = agent_run(
            plan,
            nodes,
            forwarder.address,
            host.authkey,
            job.payload,
            env,
            log_dir,
            host.restarting,
            on_exit_barrier=_at_exit_barrier.set,
            sees_other_nodes=True,  # the kernel hears every host's workers and agent
        )
        _agent_running.set()
        if _stopping.is_set():  # told to stop before the agent began (see _watch_kernel)
            return AgentEnded(stopped=True)
        try:
            result = run()
        except SignalException:
            return AgentEnded(stopped=True)
        except (LaunchError, RendezvousError) as problem:
            return AgentEnded(problem=f"{type(problem).__name__}: {problem}")
        died: list[tuple[int, int, int]] = []
        if result.is_failed():
            died = [
                (failure.local_rank, failure.pid, failure.exitcode)
                for failure in result.failures.values()
            ]
        return AgentEnded(died=died)
    finally:
        _agent_running.clear()
        _agent_returned.set()


def main() -> None:
    """Serve the kernel over standard input and output until the launch ends."""
    reader, writer = stdio_channel()
    lock = threading.Lock()
    send(writer, hello().as_dict())
    try:
        job: Any = receive(reader)
    except (EOFError, OSError):
        return
    if not isinstance(job, NodeJob):
        return  # told to stop before anything started
    host = _Host(writer, lock)
    watcher = threading.Thread(target=_watch_kernel, args=(reader, host), daemon=True)
    watcher.start()
    done = threading.Event()
    alive = threading.Thread(target=_say_alive, args=(host, done), name="alive", daemon=True)
    alive.start()
    try:
        try:
            ended = _run(job, host)
        finally:
            _ending.acquire()  # the watcher may be ending this process instead (_end_now)
            host.close()
        _say_ended(host, ended)
    finally:
        done.set()
        alive.join()


def _exit() -> None:
    """End this process once its ``atexit`` functions ran and its streams are flushed,
    without the interpreter's teardown of its modules: torch's take a third of a second, which
    the kernel would wait for (a launch ends when its hosts' channels do)."""
    run_exit_functions = getattr(atexit, "_run_exitfuncs", None)
    if run_exit_functions is None:  # another Python: its own way out
        sys.exit(0)
    run_exit_functions()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
    _exit()
