"""The pace of torch's c10d rendezvous in a launch over nodes: a waiting node looks at the
state as often as the number of nodes allows (torch's once a second is for thousands of nodes),
and a node connects to the rendezvous store as soon as node 0 has it listening."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch.distributed as dist
from torch.distributed.elastic.rendezvous import RendezvousParameters, dynamic_rendezvous
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

from nb_accel.launch.multinode import rendezvous_pace
from nb_accel.launch.multinode.rendezvous_pace import (
    FASTEST_LOOK_S,
    brisk_rendezvous,
    look_every,
    wait_listening,
)

pytestmark = pytest.mark.timeout(60)


def test_a_few_nodes_look_often_and_many_at_torchs_pace() -> None:
    assert look_every(2) == FASTEST_LOOK_S
    assert look_every(16) == pytest.approx(0.1)
    assert look_every(rendezvous_pace.NODES_AT_TORCH_PACE) == 1.0
    assert look_every(5000) == 1.0  # never slower than torch's own


@pytest.fixture
def handler() -> Iterator[Any]:
    """A real c10d rendezvous handler of two nodes, its store on this machine."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    parameters = RendezvousParameters(
        backend="c10d",
        endpoint=f"127.0.0.1:{store.port}",
        run_id="pace",
        min_nodes=2,
        max_nodes=2,
    )
    made = dynamic_rendezvous.create_handler(
        store, C10dRendezvousBackend(store, "pace"), parameters
    )
    yield made
    made.shutdown()


def test_while_an_agent_runs_the_rendezvous_waits_follow_the_node_count(
    handler: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside the block a look waits ``look_every(2)`` where torch's waits 1 s, the join's
    spread shrinks alike, and a state read is cached that long; after it, torch's pace."""
    waits: list[Any] = []

    def wait(seconds: Any) -> None:  # torch's, spied on
        waits.append(seconds)

    monkeypatch.setattr(dynamic_rendezvous, "_delay", wait)
    torch_delay, cached = dynamic_rendezvous._delay, handler._state_holder._cache_duration
    assert cached == 1
    with brisk_rendezvous(handler, 2):
        dynamic_rendezvous._delay(seconds=1)  # as torch's executor waits between two looks
        dynamic_rendezvous._delay(seconds=(0, 0.3))  # as a node spreads its first join
        assert handler._state_holder._cache_duration == FASTEST_LOOK_S
    assert waits == [FASTEST_LOOK_S, (0, pytest.approx(0.3 * FASTEST_LOOK_S))]
    assert dynamic_rendezvous._delay is torch_delay
    assert handler._state_holder._cache_duration == cached


def test_a_rendezvous_of_two_nodes_meets_at_the_brisk_pace(handler: Any) -> None:
    """Two nodes (threads here, each with its own client of the store) meet: each gets its
    rank of two."""
    client = dist.TCPStore("127.0.0.1", handler._store.port, is_master=False)
    other = dynamic_rendezvous.create_handler(
        client,
        C10dRendezvousBackend(client, "pace"),
        RendezvousParameters(
            backend="c10d", endpoint="127.0.0.1:0", run_id="pace", min_nodes=2, max_nodes=2
        ),
    )
    ranks: dict[str, int] = {}

    def meet(name: str, node: Any) -> None:
        ranks[name] = node.next_rendezvous().rank

    with brisk_rendezvous(handler, 2), brisk_rendezvous(other, 2):  # each node its own
        threads = [
            threading.Thread(target=meet, args=(name, node), daemon=True)
            for name, node in (("a", handler), ("b", other))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert sorted(ranks.values()) == [0, 1]


def test_a_node_connects_as_soon_as_the_store_listens(monkeypatch: pytest.MonkeyPatch) -> None:
    """The node tries again until node 0's store listens (here: a socket bound first, made
    to listen once the node has been refused)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    port = server.getsockname()[1]
    refused = threading.Event()
    connect = socket.create_connection

    def trying(address: Any, timeout: float) -> socket.socket:
        try:
            return connect(address, timeout=timeout)
        except OSError:
            refused.set()
            raise

    monkeypatch.setattr(rendezvous_pace.socket, "create_connection", trying)
    found: list[bool] = []
    waiter = threading.Thread(target=lambda: found.append(wait_listening("127.0.0.1", port, 30)))
    try:
        waiter.start()
        assert refused.wait(30), "the node never tried"
        server.listen()
        waiter.join(30)
    finally:
        server.close()
    assert found == [True]


def test_a_store_that_never_listens_is_left_to_torchs_client() -> None:
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))  # a port nobody listens on
        assert wait_listening("127.0.0.1", bound.getsockname()[1], 0.2) is False
