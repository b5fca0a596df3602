"""Text streams that forward a worker's ``print`` output to the kernel as events."""

from __future__ import annotations

import io
import threading
from typing import Literal

from ..._messages import Output
from .channel import EventChannel

__all__ = ["RelayStream"]


class RelayStream(io.TextIOBase):
    """A line-buffered text stream whose complete lines become :class:`Output` events."""

    def __init__(self, channel: EventChannel, stream: Literal["stdout", "stderr"], fd: int) -> None:
        super().__init__()
        self._channel = channel
        self._stream: Literal["stdout", "stderr"] = stream
        self._fd = fd
        self._buffer: list[str] = []
        self._lock = threading.Lock()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        """Always UTF-8."""
        return "utf-8"

    def writable(self) -> bool:
        """Always writable."""
        return True

    def isatty(self) -> bool:
        """Not a terminal: progress bars should not draw control sequences here."""
        return False

    def fileno(self) -> int:
        """The underlying file descriptor (output written there bypasses the relay)."""
        return self._fd

    def write(self, text: str) -> int:
        """Buffer ``text``; send every complete line at once."""
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        with self._lock:
            self._buffer.append(text)
            if "\n" not in text:
                return len(text)
            joined = "".join(self._buffer)
            cut = joined.rfind("\n") + 1
            ready, rest = joined[:cut], joined[cut:]
            self._buffer = [rest] if rest else []
        self._channel.send(Output(self._channel.rank, self._stream, ready))
        return len(text)

    def flush(self) -> None:
        """Send whatever is buffered, even without a trailing newline."""
        with self._lock:
            pending = "".join(self._buffer)
            self._buffer = []
        if pending:
            self._channel.send(Output(self._channel.rank, self._stream, pending))
