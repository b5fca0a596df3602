"""How long the kernel has spent at ranks' prompts: written by the kernel, read by the ranks.

While a rank sits at a debugger prompt (or ``input()``) the other ranks wait for it, and that
wait must not count towards the launch's collective timeout. The kernel keeps a small file in
the launch's folder saying how many seconds its prompts have been open in all, and since when
the current one is open (``CLOCK_MONOTONIC``, the same clock in every process of a machine);
:class:`~nb_accel.runtime.debugging.deadline.CollectiveDeadline` reads it in each worker. The
file is replaced whole on each change, so a reader never sees half of one.
"""

from __future__ import annotations

import contextlib
import os
import time

__all__ = ["CLOCK_FILE", "prompt_seconds", "write_prompt_clock"]

#: The clock's file name in a launch's folder.
CLOCK_FILE = "prompt-clock"


def write_prompt_clock(path: str, closed_s: float, open_since: float | None) -> None:
    """Say that prompts have been open ``closed_s`` seconds in all before the current one,
    which has been open since ``open_since`` (``time.monotonic()``; ``None``: none is)."""
    staging = f"{path}.{os.getpid()}"
    with contextlib.suppress(OSError):  # the launch's folder is gone: nobody reads it
        with open(staging, "w", encoding="ascii") as file:
            file.write(f"{closed_s!r} {open_since if open_since is not None else -1.0!r}\n")
        os.replace(staging, path)


def prompt_seconds(path: str, now: float | None = None) -> float:
    """Seconds the kernel's prompts have been open in all up to ``now`` (``time.monotonic()``);
    0 when the file is missing or unreadable (no prompt was ever open)."""
    try:
        with open(path, encoding="ascii") as file:
            closed, since = (float(part) for part in file.read().split())
    except (OSError, ValueError):
        return 0.0
    if since < 0:
        return closed
    return closed + max(0.0, (time.monotonic() if now is None else now) - since)
