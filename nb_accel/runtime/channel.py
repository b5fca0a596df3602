"""Worker side of the event channel: thread-safe sending of typed events to the kernel."""

from __future__ import annotations

import threading
from multiprocessing.connection import Connection

from .._messages import Event, encode

__all__ = ["EventChannel", "current_channel", "set_current_channel"]


class EventChannel:
    """Sends events over the worker's connection; safe to call from any thread."""

    def __init__(self, conn: Connection, rank: int) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self.rank = rank
        self.closed = False

    def send(self, event: Event) -> None:
        """Send one event; silently drops it once the kernel has gone away."""
        data = encode(event)
        with self._lock:
            if self.closed:
                return
            try:
                self._conn.send_bytes(data)
            except (BrokenPipeError, ConnectionResetError, OSError):
                self.closed = True

    def receive(self) -> bytes:
        """Block until the kernel sends a message (a persistent worker's next command);
        ``EOFError`` when the kernel has gone away."""
        return self._conn.recv_bytes()

    def close(self) -> None:
        """Stop sending; later events are dropped."""
        with self._lock:
            self.closed = True


_current: EventChannel | None = None


def current_channel() -> EventChannel | None:
    """The channel of this worker process, or ``None`` outside a launch."""
    return _current


def set_current_channel(channel: EventChannel | None) -> None:
    """Install the worker's channel (done once by the worker entrypoint)."""
    global _current  # noqa: PLW0603 - one channel per worker process
    _current = channel
