"""What a node of a multi-node launch advertises, and what it refuses before any worker starts.

The launches between two real machines are in ``tests/multiproc/test_multinode_network.py``;
here the same rules are checked on this machine, with the other node's card made up.
"""

from __future__ import annotations

import dataclasses

import pytest

from nb_accel import _env
from nb_accel.launch.multinode.network import (
    addresses_of,
    interface_of,
    is_loopback,
    source_toward,
    split_endpoint,
)
from nb_accel.launch.multinode.node_addresses import NodeCard, NodeNetwork


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("10.0.0.1:29500", ("10.0.0.1", 29500)),
        ("node0.cluster:1", ("node0.cluster", 1)),
        ("[fd00::1]:29500", ("fd00::1", 29500)),
        ("fd00::1", ("fd00::1", None)),
        ("node0", ("node0", None)),
    ],
)
def test_an_endpoint_is_split_into_host_and_port(
    endpoint: str, expected: tuple[str, int | None]
) -> None:
    assert split_endpoint(endpoint) == expected


@pytest.mark.parametrize(
    ("address", "loopback"),
    [("127.0.1.1", True), ("::1", True), ("::ffff:127.0.0.1", True), ("10.0.0.1", False)],
)
def test_loopback_addresses_are_told_apart(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback


def test_the_route_to_loopback_leaves_from_the_loopback_interface() -> None:
    assert source_toward("127.0.0.1") == "127.0.0.1"
    assert interface_of("127.0.0.1") == _env.loopback_interface()


def _other_machine(card: NodeCard, **changes: object) -> NodeCard:
    return dataclasses.replace(card, stack="another-machine", **changes)  # type: ignore[arg-type]


def test_node_0_advertises_its_endpoint_s_host_and_the_others_their_route_to_it() -> None:
    assert NodeNetwork("node0.cluster:29500", 0).address == "node0.cluster"
    assert NodeNetwork("127.0.0.1:29500", 1).address == "127.0.0.1"
    card = NodeNetwork("127.0.0.1:29500", 1).card
    assert NodeCard.decode(card.encode()) == card


def test_a_loopback_address_for_another_machine_is_named_with_what_it_resolved_to() -> None:
    node1 = NodeNetwork("10.0.0.1:29500", 1)
    node0 = _other_machine(node1.card, node_rank=0, host="gpu0", endpoint="localhost:29500")
    problem = node1.problem([node0, node1.card], 1, "localhost")
    assert problem is not None
    resolved = ", ".join(addresses_of("localhost"))
    assert f"at 'localhost', which resolves here to {resolved}: a loopback address" in problem
    assert "node 1 would meet the workers of node 0 (host gpu0)" in problem
    assert "('localhost:29500' there)" in problem
    assert "node 1 was given '10.0.0.1:29500'" in problem


def test_an_address_that_does_not_resolve_is_refused_too() -> None:
    node1 = NodeNetwork("10.0.0.1:29500", 1)
    node0 = _other_machine(node1.card, node_rank=0)
    problem = node1.problem([node0, node1.card], 1, "no-such-host.invalid")
    assert problem is not None and "cannot look up 'no-such-host.invalid'" in problem


def test_nodes_on_one_machine_meet_on_loopback() -> None:
    node1 = NodeNetwork("127.0.0.1:29500", 1)
    node0 = dataclasses.replace(node1.card, node_rank=0)
    assert node1.problem([node0, node1.card], 1, "127.0.0.1") is None
    loopback = _env.loopback_interface()
    assert node1.worker_env([node0], environ={}) == {
        "GLOO_SOCKET_IFNAME": loopback,
        "NCCL_SOCKET_IFNAME": loopback,
    }
    assert node1.worker_env([node0], environ={"GLOO_SOCKET_IFNAME": "eth9"}) == {
        "NCCL_SOCKET_IFNAME": loopback
    }


def test_a_loopback_gloo_interface_is_refused_when_a_node_is_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", str(_env.loopback_interface()))
    node0 = NodeNetwork("127.0.0.1:29500", 0)
    node1 = _other_machine(node0.card, node_rank=1, host="gpu1", address="10.0.0.2")
    problem = node0.problem([node0.card, node1], 0, "127.0.0.1")
    assert problem is not None
    assert "node 0 has GLOO_SOCKET_IFNAME=" in problem
    assert "node 1 (host gpu1) runs on another machine" in problem
