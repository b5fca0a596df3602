"""How the kernel and a host's node process talk over the host's channel (the standard input
and output of ``ssh`` or ``srun``): one length-prefixed pickled message per frame
(:func:`send`, :func:`receive`), the channel over the node's own standard input and output
(:func:`stdio_channel`), and the :class:`~nb_accel._messages.hosts.Hello` a node opens it
with (:func:`hello`: its :func:`local_versions` and a :func:`free_port`).

What travels on it, and in which order, is the catalogue's
:mod:`nb_accel._messages.hosts`.
"""

from __future__ import annotations

import os
import pickle
import platform
import socket
import sys
from multiprocessing.connection import Connection
from typing import Any

from ..._messages import FromNode, Hello, ToNode, Versions

__all__ = [
    "ALIVE_EVERY_S",
    "SILENT_S",
    "free_port",
    "hello",
    "local_versions",
    "receive",
    "send",
    "stdio_channel",
]


#: How often a node with a job says it is alive (:class:`~nb_accel._messages.hosts.Alive`).
ALIVE_EVERY_S = 1.0
#: How long the kernel waits without a word from a node with a job before it gives the host
#: up (nothing waiting to be read either): three signs of life missed.
SILENT_S = 3 * ALIVE_EVERY_S


def local_versions() -> Versions:
    """This interpreter's :class:`~nb_accel._messages.hosts.Versions`."""
    import torch

    from ..._version import __version__

    return Versions(
        python=".".join(platform.python_version_tuple()[:2]),
        torch=str(torch.__version__),
        nb_accel=__version__,
    )


def send(conn: Connection, message: ToNode | FromNode | dict[str, Any]) -> None:
    """Write one message on ``conn`` (a node's hello goes as a plain dict)."""
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def receive(conn: Connection) -> Any:
    """Read one message from ``conn`` (``EOFError`` at its end)."""
    return pickle.loads(conn.recv_bytes())


def free_port() -> int:
    """A TCP port free on this machine now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


def hello() -> Hello:
    """This node's :class:`~nb_accel._messages.hosts.Hello`."""
    return Hello(socket.gethostname(), local_versions(), free_port(), sys.executable)


def stdio_channel() -> tuple[Connection, Connection]:
    """The channel to the kernel, over this process's standard input and output: (reader,
    writer). File descriptor 1 then goes to standard error, so that nothing printed here
    (by torch, by the agent) can break the channel's frames."""
    reader = Connection(os.dup(0), writable=False)
    writer = Connection(os.dup(1), readable=False)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return reader, writer
