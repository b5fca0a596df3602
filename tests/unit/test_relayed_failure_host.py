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
@pytest.mark.parametrize(
    ("index", "rank"),
    [(0, 3), (1, 2)],  # relayed by gpu-a's rank; gpu-b's rank's own
    ids=["relayed-by-another-host", "its-own-host"],
)
def test_a_forwarded_failure_names_its_rank_s_host(index: int, rank: int) -> None:
    node = NodeChannel(index, HOSTS[index], SimpleNamespace(reader=None, writer=None))  # type: ignore[arg-type]
    failed = Failure(rank, "builtins.KeyError", "'only here'", "", None, host="node1")
    event = node.event(Forwarded(0, encode(failed)), _host_of)
    assert isinstance(event, Failure) and event.host == "gpu-b"
