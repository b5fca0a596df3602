"""Whether the out-of-memory killer ended a worker: Linux counts every process it kills for
lack of memory (``oom_kill`` in ``/proc/vmstat``, the whole machine's and every container's),
so a count taken when a worker started and again when it was found killed by ``SIGKILL`` tells
the out-of-memory killer (the count rose) from a ``kill -9`` or a scheduler (it did not)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["VMSTAT", "oom_kills", "oom_verdict"]

#: The kernel's event counters.
VMSTAT = Path("/proc/vmstat")


def oom_kills() -> int | None:
    """How many processes the out-of-memory killer has ended on this machine since it
    started; ``None`` where the kernel does not say (not Linux, or too old)."""
    try:
        text = VMSTAT.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == "oom_kill":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def oom_verdict(before: int | None) -> bool | None:
    """Whether an out-of-memory kill happened on this machine since the count was ``before``
    (``None``: unknown, no count then or now)."""
    if before is None:
        return None
    now = oom_kills()
    return None if now is None else now > before
