"""Which worker errors are a collective's timeout: the launch then says which ranks did not
arrive; a backend that could not connect is a network problem and keeps its own message."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from nb_accel.worker.process.outcomes import is_timeout_error


@pytest.mark.parametrize(
    "error",
    [
        dist.DistBackendError("[../gloo/transport/tcp/pair.cc:534] Read error: Timed out"),
        RuntimeError("Timed out waiting 600000ms for recv operation to complete"),
        dist.DistStoreError("wait timeout after 1800000ms, keys: /default_pg/0//cpu//0"),
    ],
)
def test_a_collective_that_waited_too_long_is_a_timeout(error: BaseException) -> None:
    assert is_timeout_error(error)


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError(
            "Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/pair.cc:144]"
            " timed out connecting: Connection refused, remote=[192.168.213.2]:41919"
        ),
        dist.DistNetworkError("Connection refused: connect to 10.0.0.1:29500 timed out"),
        ValueError("timeout must be positive"),
    ],
)
def test_a_failed_connection_or_another_error_is_not(error: BaseException) -> None:
    assert not is_timeout_error(error)
