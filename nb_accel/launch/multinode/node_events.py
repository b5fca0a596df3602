"""Kernel side of a multi-node launch: this node's workers' events, heard in the background.

The elastic agent keeps the kernel's main thread while the workers run, so a background thread
(:class:`WorkerListener`) accepts the workers' connections (a Unix socket in the abstract
namespace, with an authentication key only this launch's workers know) and
:class:`NodeEvents` handles their events as they come:
output is printed, progress goes to the launch view, results and failures are kept for the end.
A restarted worker group opens new connections; events of an earlier attempt are then only
printed.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import threading
from collections.abc import Callable
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener, wait
from typing import Any

from ..._messages import Output, Prompt, Report, Started, decode
from ..captured import TAIL_BYTES
from ..debugging.prompts import answer_prompt
from ..failures.failure_log import FailureLog
from ..launchers.dispatch import TICK_S, DispatchHooks, EventDispatcher
from ..views.output import OutputSink
from ..views.view import LaunchView
from .restarts import Restarts, worker_deaths

__all__ = ["NodeEvents", "NodeHooks", "NodeView", "WorkerListener"]


class NodeView:
    """A launch view shown ranks ``first .. first + count - 1`` as its rows ``0 .. count - 1``
    (the node's ranks; the title says which they are). Another node's ranks are not shown."""

    def __init__(self, view: LaunchView, first: int, count: int) -> None:
        self._view = view
        self._first = first
        self._count = count

    def _local(self, rank: int) -> int | None:
        index = rank - self._first
        return index if 0 <= index < self._count else None

    def started(self, rank: int, pid: int) -> None:
        """Pass on to the row of ``rank``."""
        if (index := self._local(rank)) is not None:
            self._view.started(index, pid)

    def report(self, event: Report) -> None:
        """Pass on to the row of the event's rank."""
        if (index := self._local(event.rank)) is not None:
            self._view.report(dataclasses.replace(event, rank=index))

    def failed(self, rank: int, summary: str) -> None:
        """Pass on to the row of ``rank``."""
        if (index := self._local(rank)) is not None:
            self._view.failed(index, summary)

    def returned(self, rank: int) -> None:
        """Pass on to the row of ``rank``."""
        if (index := self._local(rank)) is not None:
            self._view.returned(index)

    def stopped(self, rank: int, reason: str) -> None:
        """Pass on to the row of ``rank``."""
        if (index := self._local(rank)) is not None:
            self._view.stopped(index, reason)

    def tick(self) -> None:
        """Pass on."""
        self._view.tick()

    def finished(self, ok: bool) -> None:
        """Pass on."""
        self._view.finished(ok)

    def restarted(self, summary: str) -> None:
        """Pass on."""
        self._view.restarted(summary)


class WorkerListener:
    """Accepts one node's workers' connections (a Unix socket in the abstract namespace, with
    an authentication key only this launch's workers know) and reads their frames in the
    background; what is done with each frame is :meth:`on_frame`'s (a subclass's).

    Args:
        authkey: the secret the workers authenticate with.

    Attributes:
        address: where the workers connect.
    """

    def __init__(self, authkey: bytes) -> None:
        self.address = f"\0nb_accel-node-{os.getpid()}-{secrets.token_hex(8)}"
        self._authkey = authkey
        self._listener = Listener(self.address, family="AF_UNIX", authkey=authkey)
        self._lock = threading.Lock()
        self._new: list[Connection] = []
        self._posted: list[Callable[[], None]] = []
        self._closing = threading.Event()
        self._wake_read, self._wake_write = os.pipe()
        self._acceptor = threading.Thread(target=self._accept, name="nb_accel-accept", daemon=True)
        self._pump = threading.Thread(target=self._run, name="nb_accel-events", daemon=True)

    def listen(self) -> None:
        """Start accepting and reading (call once the subclass is ready for frames)."""
        self._acceptor.start()
        self._pump.start()

    def on_frame(self, data: bytes, conn: Connection) -> None:
        """One frame a worker sent on ``conn``."""

    def on_wake(self) -> float | None:
        """Called whenever the reading loop wakes: seconds until it must wake again (``None``:
        at the next tick)."""
        return None

    def post(self, call: Callable[[], None]) -> None:
        """Have the reading thread run ``call`` before it reads the next frames (from any
        thread: what the frames change is then changed on one thread only, in order)."""
        with self._lock:
            self._posted.append(call)
        os.write(self._wake_write, b"\0")

    def _run_posted(self) -> None:
        with self._lock:
            calls, self._posted = self._posted, []
        for call in calls:
            call()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                conn = self._listener.accept()
            except (AuthenticationError, EOFError, ConnectionError):
                continue  # not one of this launch's workers
            except OSError:
                return
            if self._closing.is_set():
                conn.close()
                return
            with self._lock:
                self._new.append(conn)
            os.write(self._wake_write, b"\0")

    def _run(self) -> None:
        open_conns: list[Connection] = []
        while True:
            with self._lock:
                open_conns.extend(self._new)
                self._new.clear()
            self._run_posted()
            if self._closing.is_set() and not open_conns:
                return
            due = self.on_wake()
            timeout = 0.0 if self._closing.is_set() else max(0.0, TICK_S if due is None else due)
            ready = wait([*open_conns, self._wake_read], timeout)
            self._run_posted()  # posted before the frames that woke this loop were sent
            for item in ready:
                if item == self._wake_read:
                    os.read(self._wake_read, 4096)
                    continue
                assert isinstance(item, Connection)
                if not self._drain(item):
                    open_conns.remove(item)
                    item.close()
            if self._closing.is_set() and not ready:
                for conn in open_conns:
                    conn.close()
                return

    def _drain(self, conn: Connection) -> bool:
        """Pass on the frames waiting on ``conn``; False at its end."""
        try:
            while conn.poll():
                self.on_frame(conn.recv_bytes(), conn)
        except (EOFError, OSError):
            return False
        return True

    def close(self) -> None:
        """Stop listening, hear out the open connections, and end both threads."""
        self._closing.set()
        try:
            Client(self.address, family="AF_UNIX", authkey=self._authkey).close()
        except OSError:
            pass
        self._acceptor.join(5)
        self._listener.close()
        os.write(self._wake_write, b"\0")
        self._pump.join(5)
        os.close(self._wake_read)
        os.close(self._wake_write)


class _StderrTails:
    """Passes each :class:`Output` event on, keeping the end of each rank's stderr (a callable
    of its own, so that the dispatcher's output callback does not lead back to the hooks)."""

    def __init__(self, on_output: OutputSink) -> None:
        self._printer = on_output
        #: The end of what each rank wrote to stderr, by rank.
        self.tails: dict[int, str] = {}

    def __call__(self, event: Output) -> None:
        """Keep the end of ``event``'s rank's stderr, and print."""
        if event.stream == "stderr":
            tail = self.tails.get(event.rank, "") + event.text
            self.tails[event.rank] = tail[-TAIL_BYTES:]
        self._printer(event)


class NodeHooks(DispatchHooks):
    """The dispatch of one multi-node launch's events, wherever they are read: events are told
    apart by their sender (a connection), and a sender of an attempt the group was restarted
    after counts no more; the end of each rank's stderr is kept.

    A restart of the group (``max_restarts``) is shown once the first worker of the new attempt
    starts, as a line naming the failure that ended the attempt before
    (:class:`~nb_accel.launch.multinode.restarts.Restarts`); the workers an agent saw die
    without reporting (:meth:`agent_restarting`) count among that attempt's failures.

    Args:
        on_output: given each :class:`Output` event (and asked to write held-back output
            whenever the loop wakes).
        view: told of starts, progress reports, failures and restarts.
        max_restarts: how many times the agents may restart the group.
    """

    def __init__(self, on_output: OutputSink, view: LaunchView, max_restarts: int = 0) -> None:
        tails = _StderrTails(on_output)
        self._output = on_output
        #: The restarts so far, and what caused them.
        self.restarts = Restarts(max_restarts)
        self.events = EventDispatcher(tails, view, self, on_output.flush_due)
        self._attempt_of: dict[Any, int] = {}
        self._rank_of: dict[Any, int] = {}
        self._attempt = 0
        #: The end of what each rank wrote to stderr (its file descriptor 2 included): a rank
        #: that died without reporting is judged by its last words (NCCL's watchdog, say).
        self.stderr_tail: dict[int, str] = tails.tails
        #: Whether any worker has started (so the rendezvous was reached).
        self.workers_started = False

    @property
    def results(self) -> dict[int, bytes]:
        """This attempt's results (pickled), by rank."""
        return self.events.results

    @property
    def failures(self) -> FailureLog:
        """This attempt's failures (the view shows the root cause as failed, the rest
        stopped)."""
        return self.events.failures

    @property
    def attempt(self) -> int:
        """The newest attempt (restart count) a worker has reported from."""
        return self._attempt

    def started(self, event: Started, sender: Any) -> None:
        """Note the attempt of ``sender``; a newer attempt starts afresh."""
        self.workers_started = True
        self._attempt_of[sender] = event.attempt
        self._rank_of[sender] = event.rank
        if event.attempt > self._attempt:
            ended = self.events.failures
            ended.settle()
            self.events.view.restarted(self.restarts.line(event.attempt, ended))
            self._attempt = event.attempt
            self.events.new_attempt()

    def agent_restarting(
        self,
        node_rank: int,
        attempt: int,
        died: list[tuple[int, int, int]],
        per_node: int,
        host: str | None = None,
    ) -> None:
        """Node ``node_rank``'s agent restarts its workers for ``attempt``; ``died``: its
        workers that ended, as ``(local rank, pid, exit code)``. Those that died without
        reporting count among the ending attempt's failures (when no worker of ``attempt``
        has been heard from yet: else the restart has been shown already)."""
        if attempt <= self._attempt:
            return
        log = self.events.failures
        reported = log.ranks | set(self.events.results) | log.stopped_ranks
        for record in worker_deaths(
            node_rank, died, per_node, reported, self.stderr_tail, host=host
        ):
            log.add(record)

    def current(self, sender: Any) -> bool:
        """Whether ``sender`` belongs to the newest attempt."""
        return self._attempt_of.get(sender, -1) == self._attempt

    def rank_of(self, sender: Any) -> int | None:
        """The rank that opened ``sender``."""
        return self._rank_of.get(sender)


class NodeEvents(WorkerListener, NodeHooks):
    """Listens for this node's workers and keeps what they report (see :class:`NodeHooks`).

    Args:
        on_output: given each :class:`Output` event.
        view: told of starts, progress reports, failures and restarts.
        authkey: the secret the workers authenticate with.
        max_restarts: how many times the agent may restart the group.
    """

    def __init__(
        self, on_output: OutputSink, view: LaunchView, authkey: bytes, max_restarts: int = 0
    ) -> None:
        WorkerListener.__init__(self, authkey)
        NodeHooks.__init__(self, on_output, view, max_restarts)
        self.listen()

    def on_frame(self, data: bytes, conn: Connection) -> None:
        """Handle the event; a rank's prompt (its debugger, ``input()``) is asked here, in the
        kernel, and answered on ``conn`` (the other ranks' events wait meanwhile)."""
        event = decode(data)
        if isinstance(event, Prompt):
            answer_prompt(event, self._output.flush, conn.send_bytes)
            return
        self.events.handle(event, conn)

    def on_wake(self) -> float | None:
        """Write held-back output when due."""
        return self.events.wake()
