"""The connections a process group opened, as a rank notes them to free its own wait: shut down
when noted, and never a later socket that took a noted descriptor's number."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from nb_accel.runtime.groups import sockets as group_sockets


@pytest.fixture
def server() -> Iterator[socket.socket]:
    listening = socket.create_server(("127.0.0.1", 0))
    try:
        yield listening
    finally:
        listening.close()
        group_sockets.forget_group_sockets()


def _connect(server: socket.socket) -> tuple[socket.socket, socket.socket]:
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    return client, accepted


def test_the_noted_connections_are_shut_down(server: socket.socket) -> None:
    before = group_sockets.connected_tcp_sockets()
    client, accepted = _connect(server)
    with client, accepted:
        group_sockets.note_group_sockets(before)
        assert group_sockets.shut_down_group_sockets() == 2  # both ends live in this process
        assert accepted.recv(1) == b""  # the peer sees the connection end


def test_a_socket_that_took_a_noted_number_is_left_alone(server: socket.socket) -> None:
    before = group_sockets.connected_tcp_sockets()
    client, accepted = _connect(server)
    number = client.fileno()
    with accepted:
        group_sockets.note_group_sockets(before | {accepted.fileno()})  # the client end only
        client.close()  # the group went; another connection takes its descriptor number
        other, other_peer = _connect(server)
        with other, other_peer:
            if other.fileno() != number:  # put it where the noted one was
                os.dup2(other.fileno(), number)
                os.close(other.detach())
                other = socket.socket(fileno=number)
            assert group_sockets.shut_down_group_sockets() == 0
            other_peer.sendall(b"x")
            assert other.recv(1) == b"x"  # still connected
            other.close()
