"""A failure a host's node forwards names the host of its rank, as the user named it: a rank
that lost its peers relays another host's rank's failure (read in the workers' store), and
that relay may reach the kernel first."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from nb_accel._messages import Failure, encode
from nb_accel._messages.hosts import Forwarded
from nb_accel.launch.hosts.connections import NodeChannel

HOSTS = ["gpu-a", "gpu-b"]


def _host_of(rank: int) -> str:
    return HOSTS[rank // 2]  # two ranks on each


@pytest.mark.timeout(30)
def test_a_failure_relayed_by_another_host_names_its_rank_s_host() -> None:
    first_host = NodeChannel(0, "gpu-a", SimpleNamespace(reader=None, writer=None))  # type: ignore[arg-type]
    relayed = Failure(3, "builtins.KeyError", "'only on rank 3'", "", None, host="node1")
    event = first_host.event(Forwarded(0, encode(relayed)), _host_of)
    assert isinstance(event, Failure) and event.host == "gpu-b"


@pytest.mark.timeout(30)
def test_a_host_s_own_rank_s_failure_names_that_host() -> None:
    second_host = NodeChannel(1, "gpu-b", SimpleNamespace(reader=None, writer=None))  # type: ignore[arg-type]
    own = Failure(2, "builtins.ValueError", "bad", "", None, host="node1")
    event = second_host.event(Forwarded(0, encode(own)), _host_of)
    assert isinstance(event, Failure) and event.host == "gpu-b"
