"""torch's elastic loggers, quiet while an agent runs.

torch's elastic agent and its process contexts log every rendezvous step, and on a worker's
failure its whole traceback, which the launch reports itself, with the rank and host, in
words. Writing that record is also slow: torch's log format imports ``torch._dynamo`` the first
time it formats one (about a second), and a node's agent writes it before it says that its
worker died. While an agent runs, on every node (the kernel's own, a host's node process, a
Ray actor's), these loggers log nothing below ``CRITICAL``; their levels are given back after.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

__all__ = ["ELASTIC_LOGGERS", "quiet_elastic_logs"]

#: The loggers (and every logger under them) that an agent's run quiets.
ELASTIC_LOGGERS = (
    "torch.distributed.elastic",
    "torch.distributed.launcher",
    "torch.multiprocessing",
)


@contextlib.contextmanager
def quiet_elastic_logs() -> Iterator[None]:
    """Inside the block, :data:`ELASTIC_LOGGERS` and the loggers under them log only
    ``CRITICAL`` records; after it, each has its own level again (also as a decorator)."""
    names = [
        name
        for name in [*ELASTIC_LOGGERS, *logging.root.manager.loggerDict]
        if name.startswith(ELASTIC_LOGGERS)
    ]
    levels = {name: logging.getLogger(name).level for name in dict.fromkeys(names)}
    for name in levels:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
