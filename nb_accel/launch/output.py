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
        from_first_line: prefix from the first line on (when every rank's output is asked for).
    """

    def __init__(self, world_size: int, prefix: bool = True, from_first_line: bool = False) -> None:
        self._prefix = prefix and world_size > 1
        self._from_first_line = from_first_line
        self._at_line_start: dict[tuple[int, str], bool] = {}
        self._printed: set[int] = set()
        self._open_line: dict[str, int | None] = {}  # stream -> rank whose line is unfinished

    def __call__(self, event: Output) -> None:
        """Write one :class:`Output` event; a line another rank left unfinished is ended
        first, so lines of different ranks never run together."""
        stream = sys.stdout if event.stream == "stdout" else sys.stderr
        text = event.text
        key = (event.rank, event.stream)
        self._printed.add(event.rank)
        holder = self._open_line.get(event.stream)
        if holder is not None and holder != event.rank:
            stream.write("\n")
            self._at_line_start[(holder, event.stream)] = True
        if self._prefix and (self._from_first_line or len(self._printed) > 1):
            tag = f"[rank {event.rank}] "
            start = self._at_line_start.get(key, True)
            lines = text.splitlines(keepends=True)
            text = "".join((tag if (i > 0 or start) else "") + line for i, line in enumerate(lines))
        if text:
            self._at_line_start[key] = text.endswith("\n")
            self._open_line[event.stream] = None if text.endswith("\n") else event.rank
        stream.write(text)
        stream.flush()
