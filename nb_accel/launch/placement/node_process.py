"""A host's node process as the kernel holds it, however it was started: its channel (a
reader and a writer of framed messages), whether and how it ended, and how to end it.

:class:`NodeProcess` is the one interface; :class:`PipedNode` is a local client program
(``ssh``, ``srun``) whose standard input and output are the channel. Where a transport
starts node processes by other means (Ray's actors, :mod:`.ray_nodes`), it has its own.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from multiprocessing.connection import Connection

from .short_commands import interrupt_deferred

__all__ = ["NodeProcess", "PipedNode", "StderrTail"]


class StderrTail:
    """The last lines a stream of bytes wrote, read by a thread of its own until its end."""

    def __init__(self, stream: object, keep: int = 40) -> None:
        self._stream = stream
        self._keep = keep
        self._lines: list[str] = []
        self._thread = threading.Thread(target=self._read, daemon=True, name="nb-accel-stderr")
        self._thread.start()

    def _read(self) -> None:
        readline = self._stream.readline  # type: ignore[attr-defined]
        for line in iter(readline, b""):
            self._lines.append(line.decode(errors="replace"))
            del self._lines[: -self._keep]

    def text(self, wait_s: float = 1.0) -> str:
        """What was read, waiting up to ``wait_s`` for the stream's end."""
        self._thread.join(wait_s)
        return "".join(self._lines).strip()

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` for the stream's end."""
        self._thread.join(timeout)


class NodeProcess(ABC):
    """The kernel's hold on one host's node process.

    Attributes:
        reader: the channel's end the node's messages arrive on.
        writer: the channel's end the kernel's messages leave by.
    """

    reader: Connection
    writer: Connection

    @abstractmethod
    def poll(self) -> int | None:
        """Its exit code once it ended (negative: the signal), else ``None``."""

    @abstractmethod
    def wait(self, timeout: float | None = None) -> int:
        """Wait up to ``timeout`` for its end; its exit code (``subprocess.TimeoutExpired``
        when it still runs)."""

    @abstractmethod
    def kill(self) -> None:
        """End it at once (the channel's end is what ends it gracefully)."""

    @abstractmethod
    def stderr_tail(self) -> str:
        """The last lines it (or what started it) wrote to its standard error."""

    def unreachable(self) -> bool:
        """Whether it ended before reaching its host at all (as opposed to failing there)."""
        return False

    def close(self, grace_s: float) -> None:
        """Close the channel (which ends the node), give it ``grace_s``, then kill it; reaped
        either way."""
        for conn in (self.writer, self.reader):
            conn.close()
        try:
            self.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.wait(grace_s)
        self._closed()

    def _closed(self) -> None:
        """What is left to release once the node has ended (a subclass's)."""
        return None


def _dying_with_the_kernel(command: list[str]) -> list[str]:
    """``command`` run so that it is killed when the kernel dies (util-linux's ``setpriv
    --pdeathsig``, kept across ``exec``), which ends the channel, which stops the host's node
    and its workers; as it is where ``setpriv`` is missing."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--", *command] if setpriv else command


class PipedNode(NodeProcess):
    """A node process reached through a local client program (``command``: ``ssh``,
    ``srun``) whose standard input and output are the channel; the client is killed with the
    kernel.

    Args:
        command: the client's command line.
        unreachable: whether an exit code of the client's says it never reached its host
            (``ssh``'s 255).
    """

    def __init__(self, command: list[str], unreachable: Callable[[int], bool]) -> None:
        self._unreachable = unreachable
        try:
            with interrupt_deferred():  # made whole, or not started at all
                self.process = subprocess.Popen(
                    _dying_with_the_kernel(command),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,  # the kernel's interrupt is the kernel's to pass on
                )
                assert self.process.stdin and self.process.stdout and self.process.stderr
                self.reader = Connection(os.dup(self.process.stdout.fileno()), writable=False)
                self.writer = Connection(os.dup(self.process.stdin.fileno()), readable=False)
                self._stderr = StderrTail(self.process.stderr)
        except BaseException:  # the interrupt deferred across the start: nothing is left
            if hasattr(self, "_stderr"):  # made whole: killed, then closed and reaped
                self.kill()
                self.close(5.0)
            raise

    def poll(self) -> int | None:
        """The client's exit code, once it ended."""
        return self.process.poll()

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the client."""
        return self.process.wait(timeout)

    def kill(self) -> None:
        """Kill the client's process group (``ssh``, ``srun``)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def stderr_tail(self) -> str:
        """What the client (and the node process through it) wrote to standard error."""
        return self._stderr.text()

    def unreachable(self) -> bool:
        """The client ended with its code for a host it never reached."""
        code = self.process.poll()
        return code is not None and self._unreachable(code)

    def close(self, grace_s: float) -> None:
        """Close the pipes too."""
        for stream in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError):
                stream.close()  # type: ignore[union-attr]
        super().close(grace_s)

    def _closed(self) -> None:
        self._stderr.join(5)
        if self.process.stderr is not None:
            self.process.stderr.close()
