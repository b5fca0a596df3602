"""Worker side of the event channel: thread-safe sending of typed events to the kernel."""

from __future__ import annotations

import threading
from multiprocessing.connection import Connection

from ..._messages import Event, encode
from ...runtime.rank_local import RankLocal

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

    def poll(self, timeout: float = 0.0) -> bool:
        """Whether a message from the kernel is waiting, waiting up to ``timeout`` seconds for
        one (none: not at all)."""
        return self._conn.poll(timeout)

    def close(self) -> None:
        """Stop sending; later events are dropped."""
        with self._lock:
            self.closed = True


_current: RankLocal[EventChannel | None] = RankLocal(lambda: None)


def current_channel() -> EventChannel | None:
    """The channel of this worker's rank, or ``None`` outside a launch."""
    return _current.get()


def set_current_channel(channel: EventChannel | None) -> None:
    """Install the rank's channel (done once by the worker entrypoint; per thread where a
    process runs several ranks)."""
    _current.set(channel)
