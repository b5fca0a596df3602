"""The shared-memory link's handshake: only this launch's processes may connect to process 0."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from nb_accel.runtime.data.link_local import accept_peers, peer_credentials

#: Exit status of the child when it may not change its user (a container without CAP_SETUID).
_NO_SETUID = 77
#: A child that connects to the abstract socket named by argv[1] (first once as user nobody,
#: when argv[2] is "nobody"), then waits for process 0 to hang up.
_CHILD = f"""
import os, socket, sys
name = "\\0" + sys.argv[1]
sockets, status = [], 0
if sys.argv[2] == "nobody":
    try:
        os.seteuid(65534)
    except PermissionError:
        status = {_NO_SETUID}
    else:
        sockets.append(socket.socket(socket.AF_UNIX)); sockets[-1].connect(name)
        os.seteuid(0)
sockets.append(socket.socket(socket.AF_UNIX)); sockets[-1].connect(name)
sockets[-1].recv(1)
sys.exit(status)
"""


@pytest.fixture
def listener() -> Iterator[tuple[socket.socket, str]]:
    name = f"nb_accel-test-{secrets.token_hex(8)}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind("\0" + name)
        server.listen(8)
        yield server, name


def _admit(server: socket.socket, name: str, mode: str) -> tuple[list[str], bool, int]:
    """Run accept_peers with one expected peer (a child); return warnings, whether the
    impostor was hung up on, and the pid behind the admitted connection."""
    impostor = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    impostor.connect("\0" + name)  # this process: not a peer, and it comes first
    child = subprocess.Popen([sys.executable, "-c", _CHILD, name, mode])
    try:
        with pytest.warns(RuntimeWarning) as caught:
            peers = accept_peers(server, [os.getpid(), child.pid])
        hung_up = impostor.recv(1) == b""
        admitted = peer_credentials(peers[1])[0]
        peers[1].close()
    finally:
        impostor.close()
        server.close()  # a connection left waiting is reset: the child ends either way
        status = child.wait()
    if status == _NO_SETUID:
        pytest.skip("this process may not act as another user")
    assert status == 0
    return [str(w.message) for w in caught], hung_up, admitted if admitted == child.pid else -1


def test_only_the_expected_pid_is_admitted(listener: tuple[socket.socket, str]) -> None:
    refused, hung_up, admitted = _admit(*listener, "same-user")
    assert len(refused) == 1 and f"pid {os.getpid()}" in refused[0]
    assert hung_up and admitted > 0


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another user")
def test_another_user_is_refused_even_from_the_expected_pid(
    listener: tuple[socket.socket, str],
) -> None:
    refused, hung_up, admitted = _admit(*listener, "nobody")
    assert len(refused) == 2 and "uid 65534" in refused[1]
    assert hung_up and admitted > 0
