"""A worker's file descriptors 1 and 2 forwarded to the kernel by a small process of their own.

For workers the kernel does not start itself (torch's elastic agent starts a multi-node launch's
workers, ``xmp.spawn`` an XLA launch's), so it cannot hold their pipes' other ends. The worker
makes its file descriptors 1 and 2 pipes and forks a forwarder, before it starts any thread of
its own, that reads them and sends their complete lines to the kernel as
:class:`~nb_accel._messages.Output` events. The forwarder outlives the worker: what the worker
wrote just before it died (NCCL's watchdog's message before its ``abort()``) waits in the pipe,
and the forwarder sends it once the pipe ends. It then exits; it never runs torch or user code.
"""

from __future__ import annotations

import faulthandler
import os
import select
import signal
from typing import Literal, Protocol

from ..._messages import Output, encode

__all__ = ["ByteSender", "forward_file_descriptors", "faulthandler_to_stderr", "LINGER_S"]

#: How long the forwarder keeps reading after the worker died while a process the worker
#: started still holds the pipes open (seconds).
LINGER_S = 2.0
_CHUNK = 65536

Stream = Literal["stdout", "stderr"]


class ByteSender(Protocol):
    """Where the forwarder sends its events: a connection to the kernel, or the launch's
    shared pipe (whole messages only)."""

    def send_bytes(self, data: bytes) -> None:
        """Send one message."""


def forward_file_descriptors(sender: ByteSender, rank: int) -> int:
    """Make this process's file descriptors 1 and 2 pipes whose lines a forked forwarder
    sends through ``sender`` as ``rank``'s output; returns the forwarder's pid.

    Call it early, while this process runs a single thread: the forwarder is a fork.
    ``sender`` is the forwarder's own (the caller closes its copy when it is a connection
    of its own).
    """
    stdout_read, stdout_write = os.pipe()
    stderr_read, stderr_write = os.pipe()
    streams: dict[int, Stream] = {stdout_read: "stdout", stderr_read: "stderr"}
    worker = os.getpid()
    pid = os.fork()
    if pid == 0:  # the forwarder
        code = 0
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # an interrupt is for the worker
            os.close(stdout_write)
            os.close(stderr_write)
            _forward(streams, sender, rank, worker)
        except BaseException:  # noqa: BLE001 - the forwarder ends quietly whatever happens
            code = 1
        os._exit(code)
    for target, read_fd, write_fd in (
        (1, stdout_read, stdout_write),
        (2, stderr_read, stderr_write),
    ):
        os.close(read_fd)
        os.dup2(write_fd, target)
        os.close(write_fd)
    faulthandler_to_stderr()
    return pid


def faulthandler_to_stderr() -> None:
    """Point an enabled ``faulthandler`` (inherited through a fork, writing where the kernel
    told it to) at this process's file descriptor 2, so a crash is reported with its output."""
    if faulthandler.is_enabled():
        faulthandler.enable(file=2, all_threads=True)


def _forward(streams: dict[int, Stream], sender: ByteSender, rank: int, worker: int) -> None:
    """Send the lines read from ``streams`` until every pipe ends (or, once ``worker`` has
    died, no more comes for :data:`LINGER_S`)."""
    partial: dict[int, bytes] = dict.fromkeys(streams, b"")
    poller = select.poll()
    for fd in streams:
        poller.register(fd, select.POLLIN)
    while streams:
        worker_gone = os.getppid() != worker
        ready = poller.poll(LINGER_S * 1000 if worker_gone else 500)
        if not ready and worker_gone:
            break
        for fd, _ in ready:
            data = os.read(fd, _CHUNK)
            if not data:  # the pipe ended: what is left goes too
                poller.unregister(fd)
                _send(sender, rank, streams.pop(fd), partial.pop(fd))
                continue
            data = partial[fd] + data
            cut = data.rfind(b"\n") + 1
            partial[fd] = data[cut:]
            _send(sender, rank, streams[fd], data[:cut])
    for fd, stream in streams.items():
        _send(sender, rank, stream, partial[fd])


def _send(sender: ByteSender, rank: int, stream: Stream, data: bytes) -> None:
    if data:
        text = data.decode("utf-8", errors="replace")
        sender.send_bytes(encode(Output(rank, stream, text)))
