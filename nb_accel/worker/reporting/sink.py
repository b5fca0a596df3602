"""The sink a worker installs for the library (:mod:`~nb_accel.runtime.sinks`): logged numbers
go to the rank's reporter, lines to the launch view, events down the rank's channel."""

from __future__ import annotations

from typing import Any

from ..._messages import Event
from ...runtime.sinks import set_current_sink
from .channel import EventChannel
from .reporter import current_reporter, numeric_values

__all__ = ["ChannelSink", "install_sink"]


class ChannelSink:
    """The library's way to the kernel on one rank, over that rank's event channel.

    Args:
        channel: the rank's channel (installed as the current one, so the reporter finds it).
    """

    def __init__(self, channel: EventChannel) -> None:
        self._channel = channel

    @property
    def rank(self) -> int:
        """The rank of the channel."""
        return self._channel.rank

    def log(self, values: dict[str, Any], step: int | None) -> None:
        """Hand the drawable values to the rank's reporter (tensors are read off the training
        thread, see :mod:`~nb_accel.worker.reporting.reporter`)."""
        reporter = current_reporter()
        numbers = numeric_values(values)
        if reporter is not None and numbers:
            reporter.log(numbers, step)

    def note(self, line: str) -> None:
        """Keep ``line`` on show in the launch view."""
        reporter = current_reporter()
        if reporter is not None:
            reporter.note(line)

    def tell(self, event: Event) -> None:
        """Send ``event`` to the kernel."""
        self._channel.send(event)


def install_sink(channel: EventChannel) -> None:
    """Make ``channel`` the library's way to the kernel on this rank."""
    set_current_sink(ChannelSink(channel))
