"""Kernel side of worker output: each worker's stdout/stderr written to the kernel's streams."""

from __future__ import annotations

import sys

from .._messages import Output

__all__ = ["OutputPrinter"]


class OutputPrinter:
    """Writes worker output to ``sys.stdout``/``sys.stderr``, prefixed with the rank once more
    than one rank has printed (output of a function where only rank 0 prints stays as it is).

    Args:
        world_size: number of ranks; with one rank no prefix is added.
        prefix: set to ``False`` to never prefix lines.
    """

    def __init__(self, world_size: int, prefix: bool = True) -> None:
        self._prefix = prefix and world_size > 1
        self._at_line_start: dict[tuple[int, str], bool] = {}
        self._printed: set[int] = set()

    def __call__(self, event: Output) -> None:
        """Write one :class:`Output` event."""
        stream = sys.stdout if event.stream == "stdout" else sys.stderr
        text = event.text
        self._printed.add(event.rank)
        if self._prefix and len(self._printed) > 1:
            key = (event.rank, event.stream)
            tag = f"[rank {event.rank}] "
            start = self._at_line_start.get(key, True)
            lines = text.splitlines(keepends=True)
            text = "".join((tag if (i > 0 or start) else "") + line for i, line in enumerate(lines))
            self._at_line_start[key] = text.endswith("\n")
        stream.write(text)
        stream.flush()
