"""``get_logger``: a logger for code that runs on every process, emitting on the main one.

The records name their rank (``[RANK 1] ...``). ``main_process_only=False`` emits on every
process; ``in_order=True`` emits on every process one rank after the other.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, MutableMapping
from typing import Any

from ...runtime.state import PartialState

__all__ = ["MultiProcessAdapter", "get_logger"]


def _state() -> PartialState:
    if not PartialState._shared_state.get("initialized"):
        raise RuntimeError(
            "get_logger's logger was used before the process knew its rank: create "
            "`Accelerator()` or `PartialState()` first (inside the launched function)."
        )
    return PartialState()


class MultiProcessAdapter(logging.LoggerAdapter):  # type: ignore[type-arg]
    """A ``logging.LoggerAdapter`` whose records are emitted on the main process only.

    Every logging call accepts two more keywords: ``main_process_only`` (default ``True``;
    ``False`` emits on every process) and ``in_order`` (default ``False``; ``True`` emits on
    every process, rank 0 first, each waiting for the one before: every process must make the
    call). Records start with ``[RANK i]``.
    """

    def __init__(self, logger: logging.Logger, extra: Mapping[str, object] | None = None) -> None:
        super().__init__(logger, extra or {})
        self._warned: set[tuple[Any, ...]] = set()

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        """Prefix the message with this process's rank."""
        msg, kwargs = super().process(msg, kwargs)
        return f"[RANK {_state().process_index}] {msg}", kwargs

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:
        """Log ``msg`` at ``level`` on the processes ``main_process_only``/``in_order`` choose."""
        state = _state()
        main_process_only = kwargs.pop("main_process_only", True)
        in_order = kwargs.pop("in_order", False)
        kwargs.setdefault("stacklevel", 2)  # the caller's line, not this method's
        if not self.isEnabledFor(level):
            return
        message, options = self.process(msg, kwargs)
        if not in_order:
            if state.is_main_process or not main_process_only:
                self.logger.log(level, message, *args, **options)
            return
        for index in range(state.num_processes):
            if index == state.process_index:
                self.logger.log(level, message, *args, **options)
            state.wait_for_everyone()

    def warning_once(self, *args: Any, **kwargs: Any) -> None:
        """``warning()``, but a call with the same arguments as an earlier one emits nothing."""
        key = (args, tuple(sorted(kwargs.items())))
        if key in self._warned:
            return
        self._warned.add(key)
        kwargs.setdefault("stacklevel", 3)
        self.warning(*args, **kwargs)


def get_logger(name: str, log_level: str | None = None) -> MultiProcessAdapter:
    """The logger ``name`` (``logging.getLogger(name)``), emitting on the main process only.

    Args:
        name: the logger's name, usually ``__name__``.
        log_level: a level name such as ``"DEBUG"`` set on this logger and the root logger;
            left out, the ``ACCELERATE_LOG_LEVEL`` environment variable's value, if set.
    """
    if log_level is None:
        log_level = os.environ.get("ACCELERATE_LOG_LEVEL")
    logger = logging.getLogger(name)
    if log_level is not None:
        logger.setLevel(log_level.upper())
        logging.getLogger().setLevel(log_level.upper())
    return MultiProcessAdapter(logger, {})
