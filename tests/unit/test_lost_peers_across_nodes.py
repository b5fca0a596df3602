"""What a rank of a launch on several nodes reports when its collective finds its connections
closed: the failure another rank recorded in the workers' store, the timeout of a rank that
gave up waiting for it (it came late), or, where nothing was recorded (the store's node gone),
that another node ended the launch first. A real TCP store; the rank's channel to its kernel
is a list."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import torch.distributed as dist

from nb_accel._messages import Failure
from nb_accel.worker.process import node_worker, outcomes
from nb_accel.worker.process.node_worker import NodeWorkerArgs
from nb_accel.worker.reporting.collective_trail import LastCollective

LOST = "[gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.2]:4242"


class _Channel:
    """The rank's channel to its kernel: what was sent."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send(self, event: Any) -> None:
        self.sent.append(event)


@pytest.fixture
def store() -> Iterator[Any]:
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=5))
    yield dist.PrefixStore("nb_accel/attempt_0", server)
    del server


@pytest.fixture
def channel(monkeypatch: pytest.MonkeyPatch) -> _Channel:
    sent = _Channel()
    monkeypatch.setattr(node_worker, "current_channel", lambda: sent)
    monkeypatch.setattr(node_worker, "PEER_FAILURE_WAIT_S", 0.1)  # nothing comes later here
    return sent


def _node(store: Any, monkeypatch: pytest.MonkeyPatch, rank: int, alone: bool = True) -> Any:
    for name, value in (("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "1"), ("WORLD_SIZE", "2")):
        monkeypatch.setenv(name, value)
    args = NodeWorkerArgs("", b"", rank, 2, "gloo", "cpu", 4.0, "no", b"", alone=alone)
    node = node_worker._Node(args)
    node.store = store
    return node


def _collective_failed(message: str) -> RuntimeError:
    try:
        raise RuntimeError(message)
    except RuntimeError as error:
        return error


def _timeout_of_rank_1() -> Failure:
    return Failure(1, "torch.distributed.DistBackendError", "timed out", "", None, True)


@pytest.mark.timeout(60)
def test_a_rank_that_came_late_sends_the_timeout_of_the_rank_that_gave_up_and_its_own(
    store: Any, channel: _Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = _node(store, monkeypatch, rank=1)
    node_worker._settle(other, _timeout_of_rank_1())  # rank 1 gave up waiting, and left
    late = _node(store, monkeypatch, rank=0)
    said = node_worker._failure(late, _collective_failed(LOST), ())
    assert channel.sent == [dataclasses.replace(_timeout_of_rank_1(), host=other.host)]
    assert said.rank == 0 and said.message == LOST  # its own: the kernel says it came late


@pytest.mark.timeout(60)
def test_a_recorded_failure_comes_before_a_timeout(
    store: Any, channel: _Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = _node(store, monkeypatch, rank=1)
    node_worker._settle(other, _timeout_of_rank_1())
    raised = Failure(1, "builtins.ValueError", "bad batch", "", None)
    node_worker._settle(other, raised)
    said = node_worker._failure(_node(store, monkeypatch, rank=0), _collective_failed(LOST), ())
    assert said == dataclasses.replace(raised, host=other.host) and channel.sent == []


@pytest.mark.timeout(60)
def test_a_rank_whose_peers_left_without_a_word_says_another_node_ended_the_launch(
    store: Any, channel: _Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    said = node_worker._failure(_node(store, monkeypatch, rank=0), _collective_failed(LOST), ())
    assert said.type_name == "nb_accel.errors.LaunchError", said
    assert said.message.startswith(
        "rank 0's connections to another node's ranks were closed as it came to a collective: "
        "that node ended the launch first"
    ), said
    assert "_collective_failed" in said.traceback  # where the rank called it
    assert said.host == os.uname().nodename and channel.sent == []


@pytest.mark.timeout(60)
def test_on_hosts_the_kernel_hears_every_node_and_the_lost_connection_stays_as_it_is(
    store: Any, channel: _Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = _node(store, monkeypatch, rank=0, alone=False)
    said = node_worker._failure(node, _collective_failed(LOST), ())
    assert said.message == LOST  # the kernel judges it with the others' failures


@pytest.mark.parametrize(
    ("gave_up_in", "late"), [("recv (point-to-point)", False), ("all_reduce #8", True)]
)
@pytest.mark.timeout(60)
def test_a_rank_waiting_in_another_collective_than_the_one_that_timed_out_says_its_own_wait(
    store: Any,
    channel: _Channel,
    monkeypatch: pytest.MonkeyPatch,
    gave_up_in: str,
    late: bool,
) -> None:
    in_all_reduce = LastCollective("all_reduce", 8, state="completed")  # as its own rank saw it
    monkeypatch.setattr(outcomes, "collective_raised_in", lambda exc: in_all_reduce)
    other = _node(store, monkeypatch, rank=1)
    gave_up = dataclasses.replace(_timeout_of_rank_1(), collective=gave_up_in)
    node_worker._settle(other, gave_up)
    said = node_worker._failure(_node(store, monkeypatch, rank=0), _collective_failed(LOST), ())
    assert channel.sent == [dataclasses.replace(gave_up, host=other.host)]  # either way
    if late:  # in the collective rank 1 gave up on: the kernel says rank 0 came late
        assert said.message == LOST and not said.is_timeout
        return
    assert said.is_timeout and said.collective == "all_reduce #8, finished", said
    assert said.message == (
        "rank 0 was waiting in all_reduce #8 when rank 1, waiting for it in recv "
        "(point-to-point), gave up: the ranks called different collectives"
    )
    assert "_collective_failed" in said.traceback  # where the rank called it
