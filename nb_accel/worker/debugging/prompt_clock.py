"""How long the kernel has spent at ranks' prompts: written by the kernel, read by the ranks.

While a rank sits at a debugger prompt (or ``input()``) the other ranks wait for it, and that
wait must not count towards the launch's collective timeout. The kernel keeps a small file in
the launch's folder saying how many seconds its prompts have been open in all, and since when
the current one is open (``CLOCK_MONOTONIC``, the same clock in every process of a machine);
:class:`~nb_accel.worker.debugging.deadline.CollectiveDeadline` reads it in each worker. The
file is replaced whole on each change, so a reader never sees half of one.

A host's ranks cannot read the kernel's files: the kernel tells each host's node process when
a prompt opens and closes, and the node keeps a clock of its own (:class:`PromptClock`, by this
host's monotonic clock) in its folder, named to its workers by :data:`CLOCK_VARIABLE`.
"""

from __future__ import annotations

import contextlib
import os
import time

__all__ = [
    "CLOCK_FILE",
    "CLOCK_VARIABLE",
    "PromptClock",
    "prompt_open",
    "prompt_seconds",
    "write_prompt_clock",
]

#: The clock's file name in a launch's folder.
CLOCK_FILE = "prompt-clock"
#: The environment variable naming the clock file to a worker its node process started.
CLOCK_VARIABLE = "NB_ACCEL_PROMPT_CLOCK"


class PromptClock:
    """A prompt clock's file, kept as prompts open and close (see the module).

    Args:
        path: the file.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._closed_s = 0.0
        self._open_since: float | None = None
        write_prompt_clock(path, 0.0, None)

    def set_open(self, is_open: bool) -> None:
        """A prompt opened (``True``) or closed (``False``) now."""
        now = time.monotonic()
        if is_open and self._open_since is None:
            self._open_since = now
        elif not is_open and self._open_since is not None:
            self._closed_s += now - self._open_since
            self._open_since = None
        write_prompt_clock(self.path, self._closed_s, self._open_since)


def write_prompt_clock(path: str, closed_s: float, open_since: float | None) -> None:
    """Say that prompts have been open ``closed_s`` seconds in all before the current one,
    which has been open since ``open_since`` (``time.monotonic()``; ``None``: none is)."""
    staging = f"{path}.{os.getpid()}"
    with contextlib.suppress(OSError):  # the launch's folder is gone: nobody reads it
        with open(staging, "w", encoding="ascii") as file:
            file.write(f"{closed_s!r} {open_since if open_since is not None else -1.0!r}\n")
        os.replace(staging, path)


def _read(path: str) -> tuple[float, float]:
    """The clock's seconds before the current prompt and since when that one is open (-1:
    none is); ``(0, -1)`` when the file is missing or unreadable (no prompt was ever open)."""
    try:
        with open(path, encoding="ascii") as file:
            closed, since = (float(part) for part in file.read().split())
    except (OSError, ValueError):
        return 0.0, -1.0
    return closed, since


def prompt_seconds(path: str, now: float | None = None) -> float:
    """Seconds the kernel's prompts have been open in all up to ``now`` (``time.monotonic()``);
    0 when the file is missing or unreadable (no prompt was ever open)."""
    closed, since = _read(path)
    if since < 0:
        return closed
    return closed + max(0.0, (time.monotonic() if now is None else now) - since)


def prompt_open(path: str) -> bool:
    """Whether one of the kernel's prompts is open now, as the clock at ``path`` says."""
    return _read(path)[1] >= 0
