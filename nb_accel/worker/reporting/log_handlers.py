"""Log records a rank writes reach the kernel as its other output does.

A ``logging.StreamHandler`` keeps the stream it was made with: one made in the kernel before
the launch (``logging.basicConfig()`` in the notebook, torch's own loggers at import) holds
the kernel's ``sys.stderr``, which a forked rank inherits. Its records would bypass the rank's
relay (no ``[rank N]`` prefix, out of order with its prints, lost to the live view's text).
Once the rank's streams are in place, every such handler writes to them instead.
"""

from __future__ import annotations

import logging
from typing import IO, Any

__all__ = ["follow_streams"]


def _handlers() -> list[logging.Handler]:
    """Every handler of the root logger and of every logger made so far."""
    loggers: list[Any] = [logging.getLogger()]
    loggers += list(logging.Logger.manager.loggerDict.values())
    found: list[logging.Handler] = []
    for logger in loggers:
        for handler in getattr(logger, "handlers", ()):  # placeholders have none
            if handler not in found:
                found.append(handler)
    return found


def follow_streams(moved: dict[int, IO[str]]) -> None:
    """Point each stream handler that writes to a stream in ``moved`` (by its ``id``) at the
    stream that replaced it; file handlers and others are left alone."""
    for handler in _handlers():
        if type(handler) is not logging.StreamHandler:  # a FileHandler keeps its file
            continue
        stream = getattr(handler, "stream", None)
        if stream is not None and id(stream) in moved:
            handler.setStream(moved[id(stream)])
