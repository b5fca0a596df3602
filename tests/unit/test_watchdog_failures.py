"""A worker that NCCL's watchdog aborted is judged by the watchdog's words: a collective's timeout
(or a lost peer) follows from another rank's failure, a stuck watchdog is a death of its own."""

from __future__ import annotations

import signal

from nb_accel.errors import CollectiveTimeoutError, WorkerDiedError, WorkerFailure
from nb_accel.launch.failures.failure_log import FailureLog
from nb_accel.launch.failures.verdict import died_failure

ABORTED = -int(signal.SIGABRT)
TIMEOUT_WORDS = (
    "[rank0]:[E1124 07:10:06.8 ProcessGroupNCCL.cpp:684] [Rank 0] Some NCCL operations have "
    "failed or timed out.\n"
    "[rank0]:[E1124 07:10:06.8 ProcessGroupNCCL.cpp:2197] [PG ID 0 PG GUID 0(default_pg) Rank 0] "
    "Process group watchdog thread terminated with exception: [Rank 0] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=3, OpType=BROADCAST, NumelIn=8, NumelOut=8, "
    "Timeout(ms)=60000) ran for 60012 milliseconds before timing out.\n"
    "Exception raised from checkTimeout at ProcessGroupNCCL.cpp:635 (most recent call first):\n"
)
PEER_GONE_WORDS = (
    "[E ProcessGroupNCCL.cpp:852] [Rank 0] NCCL watchdog thread terminated with exception: NCCL "
    "error: remote process exited or there was a network error, NCCL version 2.19.3\n"
)
STUCK_WORDS = (
    "[rank0]:[E1124 ProcessGroupNCCL.cpp:1400] [PG ID 0 PG GUID 0 Rank 0] ProcessGroupNCCL's "
    "watchdog got stuck for 480 seconds without making progress in monitoring enqueued "
    "collectives.\n"
)


def _raised(*records: WorkerFailure) -> BaseException:
    log = FailureLog()
    for record in records:
        log.add(record)
    status = {r: "was still running" for r in range(2) if r not in log.ranks}
    return log.exception(2, status, 60.0)


def test_a_watchdog_timeout_alone_is_a_collective_timeout_naming_its_rank_and_collective() -> None:
    record = died_failure(0, 4242, ABORTED, TIMEOUT_WORDS)
    assert record.signal_name == "SIGABRT" and record.exitcode == ABORTED
    raised = _raised(record)
    assert isinstance(raised, CollectiveTimeoutError)
    assert raised.ranks == [0]
    assert "timed out after 60 s on rank 0 of 2. Rank 1 did not arrive" in str(raised)
    assert "OpType=BROADCAST" in str(raised) and "ran for 60012 milliseconds" in str(raised)


def test_a_watchdog_timeout_follows_from_another_rank_s_error() -> None:
    cause = ValueError("bad batch")
    raised = _raised(
        died_failure(0, 4242, ABORTED, TIMEOUT_WORDS),  # arrived first
        WorkerFailure(1, "builtins.ValueError", "bad batch", "", cause),
    )
    assert raised is cause
    assert any("Rank 0 was stopped by this failure" in note for note in raised.__notes__)


def test_a_watchdog_that_lost_its_peer_follows_from_that_peer_s_death() -> None:
    raised = _raised(
        died_failure(0, 4242, ABORTED, PEER_GONE_WORDS),  # arrived first
        died_failure(1, 4243, -int(signal.SIGKILL)),
    )
    assert isinstance(raised, WorkerDiedError)
    assert str(raised).startswith("worker for rank 1 (pid 4243) was killed by SIGKILL")
    assert "Rank 0 was stopped by this failure" in str(raised)


def test_a_stuck_watchdog_is_a_death_with_the_watchdog_s_reason() -> None:
    raised = _raised(died_failure(0, 4242, ABORTED, STUCK_WORDS))
    assert isinstance(raised, WorkerDiedError)
    assert "NCCL's watchdog stopped rank 0 (pid 4242, SIGABRT)" in str(raised)
    assert "watchdog got stuck for 480 seconds" in str(raised)


def test_an_abort_without_the_watchdog_s_words_stays_a_death_by_sigabrt() -> None:
    raised = _raised(died_failure(0, 4242, ABORTED, "some other library complained\n"))
    assert isinstance(raised, WorkerDiedError)
    assert "was killed by SIGABRT" in str(raised)
