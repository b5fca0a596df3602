"""Which workers of a node wait for ``%debug``: a file each, named by its process id, in the
node's folder.

A worker on a host that raised, in a launch whose kernel keeps a rank for ``%debug``, marks
itself here before it lets its process group go (the other workers then fail and end): its
node's elastic agent, which would stop every worker once one failed, sees the mark and leaves
it running until it ends (:func:`awaiting_pids`). A file, written before the other workers can
fail, is there whenever the agent looks; no message could be.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

__all__ = ["awaiting_pids", "marked_as_awaiting"]

_PREFIX = "awaits-debugger."


@contextlib.contextmanager
def marked_as_awaiting(folder: str) -> Iterator[None]:
    """This process marked in ``folder`` as waiting for the debugger, for the block."""
    marker = os.path.join(folder, f"{_PREFIX}{os.getpid()}")
    with open(marker, "w"):
        pass
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(marker)


def awaiting_pids(folder: str) -> set[int]:
    """The process ids marked in ``folder`` as waiting for the debugger."""
    try:
        names = os.listdir(folder)
    except OSError:
        return set()
    return {
        int(name.removeprefix(_PREFIX))
        for name in names
        if name.startswith(_PREFIX) and name.removeprefix(_PREFIX).isdigit()
    }
