"""What node 0's error says of the ranks another node runs (a multi-node launch, each node's
kernel seeing only its own ranks): where they are, not a guess at what they did; and how a
rank there died, once its node's agent relayed it."""

from __future__ import annotations

from nb_accel._messages import Failure
from nb_accel.errors import WorkerDiedError
from nb_accel.launch.failures.failure_log import FailureLog
from nb_accel.launch.launchers.outcome import failure_outcome

TIMEOUT = "Timed out after 2 s waiting in all_reduce #2 (the launch's collective timeout)"
ON_NODE_1 = {1: "is on node 1, whose own launch says where it was"}


def _log(*events: Failure) -> FailureLog:
    log = FailureLog()
    for event in events:
        log.add_event(event)
    return log


def test_a_rank_of_another_node_that_did_not_arrive_is_said_to_be_there() -> None:
    timed_out = Failure(0, "builtins.TimeoutError", TIMEOUT, "", None, True)
    error = failure_outcome(_log(timed_out), 2, 2.0, [], elsewhere=ON_NODE_1)
    assert f"Rank 1 did not arrive ({ON_NODE_1[1]})." in str(error), error
    assert "still running" not in str(error), error


def test_a_rank_of_another_node_whose_death_was_relayed_is_the_cause() -> None:
    died = Failure(
        1,
        "signal",
        "worker for rank 1 (pid 7 on node-b) was killed by SIGKILL",
        "",
        None,
        host="node-b",
        signal_name="SIGKILL",
        exitcode=-9,
    )
    lost = Failure(0, "builtins.RuntimeError", "Connection closed by peer [10.0.0.2]:1", "", None)
    error = failure_outcome(_log(lost, died), 2, 2.0, [], elsewhere=ON_NODE_1)
    assert isinstance(error, WorkerDiedError), error
    assert str(error).startswith("worker for rank 1 (pid 7 on node-b) was killed by SIGKILL")
