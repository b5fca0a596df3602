"""A host's node process: started by the kernel over SSH or ``srun``
(``python -m nb_accel.launch.hosts.remote_node``), it runs torch's elastic agent for this
host's ranks and sends everything back over its standard output.

It says hello (versions, a free port), takes the :class:`~.protocol.NodeJob`, meets the other
hosts at the c10d rendezvous and runs the workers as a multi-node launch does; every frame a
worker sends is forwarded to the kernel unread, so the kernel judges the launch as a whole. A
:class:`~.protocol.StopNode`, or the end of the channel (the kernel stopped, died, or the
connection dropped), stops the agent, which stops the workers.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import shutil
import signal
import threading
from multiprocessing.connection import Connection
from typing import Any

from ...errors import LaunchError
from ..multinode.launcher import agent_run
from ..multinode.node_events import WorkerListener
from ..scratch import make_scratch_dir
from .protocol import AgentEnded, Forwarded, NodeJob, StopNode, hello, receive, send, stdio_channel

__all__ = ["main"]


class _Forwarder(WorkerListener):
    """Sends each worker's frames to the kernel as they come, numbering the connections."""

    def __init__(self, writer: Connection, lock: threading.Lock, authkey: bytes) -> None:
        super().__init__(authkey)
        self._writer = writer
        self._write_lock = lock
        self._numbers: dict[Connection, int] = {}
        self._count = itertools.count()
        self.listen()

    def on_frame(self, data: bytes, conn: Connection) -> None:
        """Forward it."""
        number = self._numbers.get(conn)
        if number is None:
            number = self._numbers[conn] = next(self._count)
        with self._write_lock, contextlib.suppress(OSError):  # the kernel has gone
            send(self._writer, Forwarded(number, data))


#: Set while the agent runs: only then does a stop request end it (afterwards this process is
#: sending its last words, and ends by itself).
_agent_running = threading.Event()
#: Set once the kernel asked this node to stop (an agent not started yet then never starts).
_stopping = threading.Event()


def _watch_kernel(reader: Connection) -> None:
    """Stop this node's agent (SIGTERM: it stops its workers) on :class:`StopNode` or at the
    end of the channel."""
    while True:
        try:
            message = receive(reader)
        except (EOFError, OSError):
            break
        if isinstance(message, StopNode):
            break
    _stopping.set()
    if _agent_running.is_set():
        os.kill(os.getpid(), signal.SIGTERM)


def _run(job: NodeJob, writer: Connection, lock: threading.Lock) -> AgentEnded:
    """Run this node's agent for ``job``; how it ended."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    plan, nodes = job.plan, job.nodes
    authkey = secrets.token_bytes(32)
    forwarder = _Forwarder(writer, lock, authkey)
    log_dir = make_scratch_dir("nodes")
    try:
        run = agent_run(plan, nodes, forwarder.address, authkey, job.payload, job.env, log_dir)
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
        forwarder.close()
        shutil.rmtree(log_dir, ignore_errors=True)


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
    watcher = threading.Thread(target=_watch_kernel, args=(reader,), daemon=True)
    watcher.start()
    ended = _run(job, writer, lock)
    with lock, contextlib.suppress(OSError):
        send(writer, ended)


if __name__ == "__main__":
    main()
