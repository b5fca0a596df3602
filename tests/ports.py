"""A TCP port for a test's server: one that nothing listens on at the moment it is asked."""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port(address: str = "127.0.0.1") -> int:
    """A port free on ``address`` now (``""``: on every address of this network namespace)."""
    with socket.socket() as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])
