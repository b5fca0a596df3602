"""Where a rank is: its Python stacks, every thread's, written on the kernel's request without
stopping the rank.

The worker registers :mod:`faulthandler` for :data:`STACK_SIGNAL`, writing to its rank's file
in the launch's folder (:func:`stack_file`). faulthandler's handler is C code: it writes every
thread's frames even while the main thread sits in a collective or any other C call, where no
Python signal handler could run. The file begins with a line naming the main thread (each
process that becomes the rank writes it anew); each request appends one dump.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import threading
from typing import TextIO

__all__ = ["MAIN_THREAD", "STACK_SIGNAL", "answer_stack_requests", "stack_file"]

#: The signal that asks a worker for its stacks.
STACK_SIGNAL = signal.SIGUSR2

#: How a stack file's first line names the main thread (its ``threading`` ident, in hex).
MAIN_THREAD = "main thread "

#: The open stack file of this process (kept open: faulthandler writes to its descriptor).
_open: list[TextIO] = []


def stack_file(folder: str, rank: int) -> str:
    """The file rank ``rank`` writes its stacks to, in the launch's ``folder``."""
    return os.path.join(folder, f"stacks-{rank}")


def answer_stack_requests(folder: str, rank: int) -> None:
    """From now on, write every thread's stack to :func:`stack_file` on :data:`STACK_SIGNAL`
    (call from the main thread, after the signal handlers are reset)."""
    # a new file: a rank replaced in a pool must not leave the old process's header first
    stream = open(stack_file(folder, rank), "w", encoding="utf-8")  # kept open: see _open
    try:
        stream.write(f"{MAIN_THREAD}0x{threading.main_thread().ident or 0:x}\n")
        stream.flush()
    except OSError:  # its file system filled up meanwhile: the rank cannot say where it is
        with contextlib.suppress(OSError):
            stream.close()
        return
    faulthandler.register(STACK_SIGNAL, file=stream, all_threads=True, chain=False)
    for old in _open:
        old.close()
    _open[:] = [stream]
