"""Ordering a test's events by marker files instead of sleeps: one side touches a file when it
has reached a point, the other waits for it (a poll with a deadline against hanging, never a
timing the test relies on)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

#: The longest a test waits for a marker (a bound against hanging, not a timing).
WAIT_S = 60.0


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    """Poll ``condition`` until it holds; ``AssertionError`` naming ``what`` past
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout_s:.0f} s")
        time.sleep(0.01)


def wait_for_files(*paths: Path, timeout_s: float = WAIT_S) -> None:
    """Wait until every one of ``paths`` exists."""
    names = ", ".join(path.name for path in paths)
    wait_until(lambda: all(path.exists() for path in paths), f"markers {names}", timeout_s)


def process_ended(pid: int) -> bool:
    """Whether process ``pid`` has exited (gone, or a zombie its parent has not reaped)."""
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _blocked(caller: FrameType, line: int, thread: int, in_python: bool) -> bool:
    """Whether ``thread`` runs line ``line`` of ``caller`` inside a call: a Python function
    (a frame above ``caller``) when ``in_python``, else C code (``caller`` innermost)."""
    top = sys._current_frames().get(thread)
    if top is None or caller.f_lineno != line:
        return False
    if not in_python:
        return top is caller
    frame = top.f_back
    while frame is not None and frame is not caller:
        frame = frame.f_back
    return frame is caller


def touch_when_waiting(
    marker: Path | str, lines_below: int = 1, in_python: bool = True, timeout_s: float = WAIT_S
) -> None:
    """Touch ``marker`` from a thread of its own once the calling thread waits in the call on
    the line ``lines_below`` lines below this one: seen there on two polls in a row, so that a
    call that merely passes through is not taken for one that waits. ``in_python``: the call
    waits inside a Python function; else inside C code (a collective's ``work.wait()``).
    Nothing is touched if that does not happen within ``timeout_s``."""
    caller = sys._getframe(1)
    line, thread = caller.f_lineno + lines_below, threading.get_ident()

    def watch() -> None:
        seen, deadline = 0, time.monotonic() + timeout_s
        while seen < 2 and time.monotonic() < deadline:
            seen = seen + 1 if _blocked(caller, line, thread, in_python) else 0
            time.sleep(0.005)
        if seen >= 2:
            Path(marker).touch()

    threading.Thread(target=watch, name="touch_when_waiting", daemon=True).start()


@contextlib.contextmanager
def when_marked(folder: Path, ranks: int, action: Callable[[], None]) -> Iterator[None]:
    """While the block runs, do ``action`` once each of ranks ``0 .. ranks - 1`` has touched
    ``folder / f"rank{N}"``; the watching thread is joined on the way out."""
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if all((folder / f"rank{rank}").exists() for rank in range(ranks)):
                action()
                return
            done.wait(0.02)

    watcher = threading.Thread(target=watch, name="when-marked")
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


def interrupt_when_marked(folder: Path, ranks: int = 2) -> contextlib.AbstractContextManager[None]:
    """:func:`when_marked` sending this process SIGINT, as Kernel -> Interrupt does."""
    return when_marked(folder, ranks, lambda: os.kill(os.getpid(), signal.SIGINT))


@contextlib.contextmanager
def interrupted_unless_done(what: str, timeout_s: float) -> Iterator[None]:
    """Run the block; if it has not ended within ``timeout_s``, interrupt it (SIGINT, as
    Kernel -> Interrupt does: a launch or pool in it stops its ranks) and fail with an
    ``AssertionError`` saying that ``what`` (what the block waits for) did not happen, and what
    the interrupt said. A bound against hanging, well under the test's own timeout: never a
    timing the test relies on."""
    lock = threading.Lock()
    done = threading.Event()
    sent: list[bool] = []

    def watch() -> None:
        if done.wait(timeout_s):
            return
        with lock:  # the block cannot end meanwhile: the interrupt lands inside it
            if not done.is_set():
                sent.append(True)
                os.kill(os.getpid(), signal.SIGINT)

    watcher = threading.Thread(target=watch, name="interrupted-unless-done", daemon=True)
    watcher.start()
    try:
        try:
            yield
        finally:
            with lock:
                done.set()
    except KeyboardInterrupt as interrupt:
        if not sent:
            raise
        said = f", saying: {interrupt}" if str(interrupt) else ""
        raise AssertionError(
            f"{what} did not happen within {timeout_s:.0f} s; interrupted then{said}"
        ) from interrupt
    finally:
        done.set()
        watcher.join()
