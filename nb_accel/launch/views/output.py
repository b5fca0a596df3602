"""Kernel side of worker output: each worker's stdout/stderr written to the kernel's streams.

Output is written in batches, at most every :data:`FLUSH_INTERVAL_S` (as a Jupyter kernel
batches a cell's own output), so a loop printing thousands of lines costs the notebook a few
stream messages a second instead of one per line. The first output after a quiet spell is
written at once. A batch keeps each rank's lines in order, stdout and stderr in the order they
came (up to :data:`MAX_SEGMENTS` switches a batch; beyond that each stream keeps its own
order), and lines of different ranks never share a line.

Whatever is held back is written before the launch view changes a rank's state (through
:attr:`OutputPrinter.view`), before a failure is raised and at the end of the launch
(:meth:`OutputPrinter.flush`); the launch's event loops call :meth:`OutputPrinter.flush_due`
whenever they wake, and wait no longer than it says.
"""

from __future__ import annotations

import string
import sys
import threading
import time
from collections.abc import Callable
from typing import Protocol, cast

from ..._messages import Output, Report
from .view import LaunchView, NullView

__all__ = [
    "FLUSH_INTERVAL_S",
    "MAX_SEGMENTS",
    "PREFIX_PLACEHOLDERS",
    "ROLE_NAME",
    "TerminalBar",
    "OutputPrinter",
    "OutputSink",
    "check_prefix_template",
]

#: Shortest time between two writes of held-back output (seconds).
FLUSH_INTERVAL_S = 0.2
#: Most runs of one stream in a batch (stdout, stderr, stdout, ... each becomes a message).
MAX_SEGMENTS = 8
#: The placeholders of a ``log_line_prefix_template``, as torch's elastic agent fills them.
PREFIX_PLACEHOLDERS = ("rank", "local_rank", "role_name")
#: The workers' role name for ``${role_name}``: that of torch's ``elastic_launch``
#: (``LaunchConfig.role``), which Accelerate's launcher and nb_accel's elastic agent use.
ROLE_NAME = "default_role"


def check_prefix_template(template: object) -> None:
    """Check a ``log_line_prefix_template`` (``None``: none): ``TypeError`` when it is not a
    ``str``, ``ValueError`` naming a placeholder other than :data:`PREFIX_PLACEHOLDERS`."""
    if template is None:
        return
    if not isinstance(template, str):
        raise TypeError(
            'log_line_prefix_template must be a str such as "[${rank}]: ", got '
            f"{type(template).__name__}"
        )
    found = string.Template.pattern.finditer(template)
    names = [match.group("named") or match.group("braced") for match in found]
    unknown = sorted({name for name in names if name and name not in PREFIX_PLACEHOLDERS})
    if unknown:
        known = ", ".join(f"${{{name}}}" for name in PREFIX_PLACEHOLDERS)
        raise ValueError(
            f"log_line_prefix_template has unknown placeholder(s) "
            f"{', '.join(f'${{{name}}}' for name in unknown)}: the known ones are {known} "
            "(write $$ for a literal $)"
        )


def _template_tag(template: str, rank: int, per_node: int) -> str:
    """``template`` filled in for ``rank`` as torch's elastic agent fills it."""
    return string.Template(template).safe_substitute(
        role_name=ROLE_NAME, rank=rank, local_rank=rank % per_node
    )


class OutputSink(Protocol):
    """Where workers' output goes: an :class:`OutputPrinter`, or what routes to one."""

    def __call__(self, event: Output) -> None:
        """Take one :class:`Output` event."""

    def flush_due(self) -> float | None:
        """Write held-back output when due; the seconds until more is due (``None``: none)."""

    def flush(self) -> None:
        """Write all held-back output now (a prompt follows it)."""


class TerminalBar(Protocol):
    """A view that draws a bar on the terminal line where printed output would go."""

    def clear_bar(self) -> None:
        """Take the bar off its line: printed output follows."""

    def redraw_bar(self) -> None:
        """Printed output ended with a complete line: draw the bar again."""


class OutputPrinter:
    """Writes worker output to ``sys.stdout``/``sys.stderr`` in batches; with more than one
    rank, every line is prefixed with its rank (``[rank N] ``), or with ``template`` filled in.

    Args:
        world_size: number of ranks whose output is shown; with one no prefix is added.
        prefix: set to ``False`` to never prefix lines.
        view: the launch's view: :attr:`view` hands it every change of a rank's state after the
            output held so far, and a view drawing a bar on the terminal (:class:`TerminalBar`)
            has it cleared before output is written and redrawn after.
        interval: shortest time between two writes (seconds; default
            :data:`FLUSH_INTERVAL_S`, read when the printer is made).
        clock: time source (seconds).
        place_of: names the machine of a rank, for the prefix (``[node1 rank 2] ``), in a
            launch across hosts.
        template: a ``log_line_prefix_template`` (checked by :func:`check_prefix_template`):
            each line's whole prefix is this, with ``${rank}``, ``${local_rank}`` and
            ``${role_name}`` filled in as torch's elastic agent does, even with one rank
            (``None`` or empty: the rank prefix).
        per_node: ranks on each machine, for ``${local_rank}`` (``None``: ``world_size``).
    """

    def __init__(
        self,
        world_size: int,
        prefix: bool = True,
        *,
        view: LaunchView | None = None,
        interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        place_of: Callable[[int], str] | None = None,
        template: str | None = None,
        per_node: int | None = None,
    ) -> None:
        self._prefix = prefix and (world_size > 1 or bool(template))
        self._place_of = place_of
        self._template = template or None
        self._per_node = max(per_node or world_size, 1)
        self._tags: dict[int, str] = {}
        self._bar = _bar_line(view)
        self._interval = FLUSH_INTERVAL_S if interval is None else interval
        self._clock = clock
        self._lock = threading.Lock()
        self._at_line_start: dict[tuple[int, str], bool] = {}
        self._open_line: dict[str, int | None] = {}  # stream -> rank whose line is unfinished
        self._pending: list[tuple[str, list[str]]] = []  # (stream, texts), in arrival order
        self._last_write = -float("inf")
        self._view: LaunchView = view if view is not None else NullView()

    @property
    def view(self) -> LaunchView:
        """The launch view, told of a rank's change of state only after the output held so far.

        A new wrapper each time, which holds this printer: were the printer to keep it, the
        two would hold each other, and a finished launch's pipes and views would wait for the
        garbage collector."""
        return _OutputFirst(self._view, self)

    def __call__(self, event: Output) -> None:
        """Take one :class:`Output` event; write what is held when the interval has passed."""
        with self._lock:
            text = self._format(event)
            if text:
                self._hold(event.stream, text)
            if self._clock() - self._last_write >= self._interval:
                self._write_held()

    def flush_due(self) -> float | None:
        """Write the held output if it is due; else the seconds until it is (``None``: nothing
        is held)."""
        with self._lock:
            if not self._pending:
                return None
            wait = self._last_write + self._interval - self._clock()
            if wait > 0:
                return wait
            self._write_held()
            return None

    def flush(self) -> None:
        """Write the held output now."""
        with self._lock:
            self._write_held()

    def _format(self, event: Output) -> str:
        """``event``'s text with the rank prefixes, after ending another rank's open line."""
        text, key = event.text, (event.rank, event.stream)
        holder = self._open_line.get(event.stream)
        ended = ""
        if holder is not None and holder != event.rank:
            ended = "\n"
            self._at_line_start[(holder, event.stream)] = True
            self._open_line[event.stream] = None
        if self._prefix:
            tag = self._tag(event.rank)
            start = self._at_line_start.get(key, True)
            lines = text.splitlines(keepends=True)
            text = "".join((tag if (i > 0 or start) else "") + line for i, line in enumerate(lines))
        if text:
            self._at_line_start[key] = text.endswith("\n")
            self._open_line[event.stream] = None if text.endswith("\n") else event.rank
        return ended + text

    def _tag(self, rank: int) -> str:
        """The prefix of ``rank``'s lines."""
        tag = self._tags.get(rank)
        if tag is None:
            if self._template is not None:
                tag = _template_tag(self._template, rank, self._per_node)
            else:
                place = f"{self._place_of(rank)} " if self._place_of else ""
                tag = f"[{place}rank {rank}] "
            self._tags[rank] = tag
        return tag

    def _hold(self, stream: str, text: str) -> None:
        if self._pending and self._pending[-1][0] == stream:
            self._pending[-1][1].append(text)
            return
        if len(self._pending) >= MAX_SEGMENTS:
            same = [parts for name, parts in self._pending if name == stream]
            if same:  # too many switches: this stream's own order is kept
                same[-1].append(text)
                return
        self._pending.append((stream, [text]))

    def _write_held(self) -> None:
        held, self._pending = self._pending, []
        if not held:
            return
        self._last_write = self._clock()
        if self._bar is not None:
            self._bar.clear_bar()
        for name, parts in held:
            stream = sys.stdout if name == "stdout" else sys.stderr
            stream.write("".join(parts))
            stream.flush()
        if self._bar is not None and all(rank is None for rank in self._open_line.values()):
            self._bar.redraw_bar()


def _bar_line(view: LaunchView | None) -> TerminalBar | None:
    """``view`` when it draws a bar on the terminal (checked by its methods: an ``isinstance``
    check against the protocol costs more than the rest of a ``%%distributed`` cell)."""
    if callable(getattr(view, "clear_bar", None)) and callable(getattr(view, "redraw_bar", None)):
        return cast(TerminalBar, view)
    return None


class _OutputFirst:
    """A launch view that writes the held output before each change of a rank's state."""

    def __init__(self, view: LaunchView, printer: OutputPrinter) -> None:
        self._view = view
        self._printer = printer

    def started(self, rank: int, pid: int) -> None:
        """Passed on."""
        self._view.started(rank, pid)

    def report(self, event: Report) -> None:
        """Passed on (progress is no change of state)."""
        self._view.report(event)

    def failed(self, rank: int, summary: str) -> None:
        """Output first, then passed on."""
        self._printer.flush()
        self._view.failed(rank, summary)

    def returned(self, rank: int) -> None:
        """Output first, then passed on."""
        self._printer.flush()
        self._view.returned(rank)

    def stopped(self, rank: int, reason: str) -> None:
        """Output first, then passed on."""
        self._printer.flush()
        self._view.stopped(rank, reason)

    def tick(self) -> None:
        """Output first (a rank may be marked as stalled), then passed on."""
        self._printer.flush()
        self._view.tick()

    def finished(self, ok: bool) -> None:
        """Output first, then passed on."""
        self._printer.flush()
        self._view.finished(ok)

    def restarted(self, summary: str) -> None:
        """Output first, then passed on (a registered view without the method shows no
        restarts)."""
        self._printer.flush()
        restarted = getattr(self._view, "restarted", None)
        if restarted is not None:
            restarted(summary)
