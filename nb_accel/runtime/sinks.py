"""Where the library reaches the worker it runs in: one sink per rank, installed by the worker.

The library (this package) never imports the worker side. What it must hand over (the numbers
``Accelerator.log`` draws, a line the launch view keeps on show, the runs a tracker started)
goes to the :class:`RankSink` the worker installed with :func:`set_current_sink`. Outside a
launch (a plain script, ``torchrun``) there is none, and the library does without.
"""

from __future__ import annotations

from typing import Any, Protocol

from .._messages import Event
from .rank_local import RankLocal

__all__ = ["RankSink", "current_sink", "set_current_sink"]


class RankSink(Protocol):
    """What a launch's worker offers the library running on one of its ranks."""

    @property
    def rank(self) -> int:
        """The rank this sink belongs to."""

    def log(self, values: dict[str, Any], step: int | None) -> None:
        """Draw ``values`` (a flat ``name: value`` dict; what cannot be drawn is left out) in
        the launch's charts, at ``step``."""

    def note(self, line: str) -> None:
        """Keep ``line`` on show in the launch's view."""

    def tell(self, event: Event) -> None:
        """Send ``event`` to the kernel."""


_current: RankLocal[RankSink | None] = RankLocal(lambda: None)


def current_sink() -> RankSink | None:
    """The sink of this rank, or ``None`` outside a launch."""
    return _current.get()


def set_current_sink(sink: RankSink | None) -> None:
    """Install the rank's sink (the worker does, once; per thread where a process runs several
    ranks)."""
    _current.set(sink)
