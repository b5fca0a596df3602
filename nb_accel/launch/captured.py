"""Kernel side of what a worker writes to its file descriptors 1 and 2.

``print`` in a worker reaches the kernel through the event channel; what bypasses Python's
``sys.stdout`` and ``sys.stderr`` — C++ and CUDA libraries (NCCL's watchdog among them),
``os.write(2, ...)``, programs the worker starts, ``faulthandler`` — is written to the worker's
file descriptors 1 and 2. Each is a pipe whose other end the kernel holds and reads, so nothing
written there is lost when the worker dies, even by ``abort()``: the bytes wait in the pipe
until the kernel reads them. Complete lines become :class:`~nb_accel._messages.Output` events,
in order within each stream; the end of a stream (or of the worker) sends the rest.

The last bytes of each worker's stderr are kept to explain its death (see
:func:`~nb_accel.launch.failures.verdict.died_failure`).
"""

from __future__ import annotations

import os
from multiprocessing.connection import Connection
from typing import Literal

from .._messages import Output

__all__ = ["TAIL_BYTES", "CapturedOutput"]

#: How much of a worker's captured stderr is kept to explain its death (bytes).
TAIL_BYTES = 16 * 1024
#: The most read at once from one pipe (its whole buffer on Linux).
_CHUNK = 65536

Stream = Literal["stdout", "stderr"]


class CapturedOutput:
    """One worker's stdout and stderr pipes, read by the kernel without blocking.

    Made before the worker starts: the worker's file descriptors 1 and 2 become the pipes'
    write ends (:attr:`write_fds`, or :meth:`child_ends` for ``multiprocessing``), and the
    kernel closes its copies of them once the worker has started.

    Args:
        rank: the worker's rank, given to every event.
    """

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._read: dict[int, Stream] = {}
        self.write_fds: tuple[int, int] = (-1, -1)
        ends = []
        for stream in ("stdout", "stderr"):
            read_fd, write_fd = os.pipe()
            os.set_blocking(read_fd, False)
            self._read[read_fd] = stream  # type: ignore[assignment]
            ends.append(write_fd)
        self.write_fds = (ends[0], ends[1])
        self._partial: dict[Stream, bytes] = {"stdout": b"", "stderr": b""}
        self._tail = b""

    def child_ends(self) -> tuple[Connection, Connection]:
        """The write ends as objects ``multiprocessing`` can hand to a forked or forkserver
        child; they own the descriptors from now on (close them once the child started)."""
        stdout_fd, stderr_fd = self.write_fds
        self.write_fds = (-1, -1)
        return Connection(stdout_fd, readable=False), Connection(stderr_fd, readable=False)

    def close_write_ends(self) -> None:
        """Close the kernel's copies of the write ends (the worker has its own)."""
        for fd in self.write_fds:
            if fd >= 0:
                os.close(fd)
        self.write_fds = (-1, -1)

    @property
    def fds(self) -> list[int]:
        """The read ends still open (to wait on)."""
        return list(self._read)

    @property
    def last_words(self) -> str:
        """The end of what the worker wrote to its stderr (at most :data:`TAIL_BYTES`)."""
        return self._tail.decode("utf-8", errors="replace")

    def read(self, fd: int) -> list[Output]:
        """Read everything waiting on ``fd``; its complete lines as events (and, at the end
        of the stream, the rest)."""
        stream = self._read.get(fd)
        if stream is None:
            return []
        chunks: list[bytes] = []
        ended = False
        while True:
            try:
                chunk = os.read(fd, _CHUNK)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                ended = True
                break
            chunks.append(chunk)
        data = self._partial[stream] + b"".join(chunks)
        if stream == "stderr" and chunks:
            self._tail = (self._tail + b"".join(chunks))[-TAIL_BYTES:]
        if ended:
            del self._read[fd]
            os.close(fd)
            ready, self._partial[stream] = data, b""
        else:
            cut = data.rfind(b"\n") + 1
            ready, self._partial[stream] = data[:cut], data[cut:]
        return [self._event(stream, ready)] if ready else []

    def read_all(self) -> list[Output]:
        """Read everything waiting on both pipes (stdout's lines first)."""
        return [event for fd in self.fds for event in self.read(fd)]

    def finish(self) -> list[Output]:
        """Read what is left, send the unfinished lines too and close the pipes (the worker
        has exited; what its children write later is not read)."""
        events = self.read_all()
        for stream, rest in self._partial.items():
            if rest:
                events.append(self._event(stream, rest))
                self._partial[stream] = b""
        self.close()
        return events

    def close(self) -> None:
        """Close every pipe end the kernel still holds."""
        self.close_write_ends()
        for fd in self._read:
            os.close(fd)
        self._read.clear()

    def _event(self, stream: Stream, data: bytes) -> Output:
        return Output(self.rank, stream, data.decode("utf-8", errors="replace"))
