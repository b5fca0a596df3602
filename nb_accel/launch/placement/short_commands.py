"""Short commands the kernel runs to learn about its hosts (``ssh -G``, ``scontrol``), always
reaped, an interrupt included.

``subprocess.run`` interrupted by the notebook's stop button kills its command but reaps it
only if it ends within a quarter of a second, and then not at all: the command is left a zombie
of the kernel until the garbage collector or a later command reaps it. Here it is killed and
reaped before the interrupt goes on.
"""

from __future__ import annotations

import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["CommandOutput", "command_output", "interrupt_deferred"]


@dataclass(frozen=True)
class CommandOutput:
    """What a finished command wrote and how it ended.

    Attributes:
        returncode: its exit code (negative: the signal that ended it).
        stdout: its standard output, as text.
        stderr: its standard error, as text.
    """

    returncode: int
    stdout: str
    stderr: str


def command_output(command: list[str], timeout: float) -> CommandOutput:
    """Run ``command`` to its end, at most ``timeout`` seconds, and read its output.

    Raises:
        OSError: the command could not be started.
        subprocess.TimeoutExpired: it ran past ``timeout`` (it was killed and reaped).
    """
    process: subprocess.Popen[str] | None = None
    try:
        with interrupt_deferred():  # started and held, or not started at all
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        # (an interrupt deferred across the start is raised above, inside this try)
        stdout, stderr = process.communicate(timeout=timeout)
    except BaseException:  # the timeout, or the kernel's interrupt: nothing is left behind
        if process is None:
            raise
        process.kill()
        process.wait()
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
        raise
    return CommandOutput(process.returncode, stdout, stderr)


@contextmanager
def interrupt_deferred() -> Iterator[None]:
    """While the block runs, the kernel's interrupt (SIGINT, on the main thread) waits, and is
    raised as the block ends: for what an interrupt must not split, a child's start and the
    kernel's note of it (CPython never reaps a child whose ``Popen`` it interrupted), or a
    command sent to every rank of a pool (sent to some only, it runs on unstopped)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    heard: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: heard.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if heard and callable(previous):
        previous(signal.SIGINT, None)  # Python's own raises KeyboardInterrupt
