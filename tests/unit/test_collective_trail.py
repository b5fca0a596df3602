"""The collective a rank last entered: read from torch's own flight recorder in a real process
group, answered through the rank's request pipe, and said in a timeout's message; the same pipe
aborts a rank's collectives, and such a rank is shown stopped by the failure that caused it."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from nb_accel.errors import CollectiveTimeoutError, WorkerFailure
from nb_accel.launch.failures.failure_log import FailureLog
from nb_accel.launch.failures.whereabouts import (
    _ask_collective,
    _read_collectives,
    abort_collectives,
)
from nb_accel.worker.process import regroup
from nb_accel.worker.reporting import collective_trail
from nb_accel.worker.reporting.collective_trail import LastCollective, answer_file

pytestmark = pytest.mark.timeout(120)

#: A one-rank gloo group that runs two collectives, then prints what the trail says (in a
#: process of its own: torch sizes its flight recorder once per process).
TWO_COLLECTIVES = """
import json, sys, dataclasses
import torch, torch.distributed as dist
from nb_accel.worker.reporting.collective_trail import enable_flight_recorder, last_collective
before = last_collective()
enable_flight_recorder()
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
dist.all_reduce(torch.ones(2))
dist.broadcast(torch.ones(2), 0)
found = last_collective()
print(json.dumps([before, dataclasses.asdict(found) if found else None]))
dist.destroy_process_group()
"""


def test_the_trail_is_torch_s_flight_recorder_of_a_real_group(tmp_path: Path) -> None:
    output = subprocess.run(
        [sys.executable, "-c", TWO_COLLECTIVES, str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    before, found = json.loads(output.strip().splitlines()[-1])
    assert before is None  # no process group yet
    assert LastCollective(**found).describe() == "broadcast #2"


@pytest.mark.parametrize(
    ("collective", "said"),
    [
        (LastCollective("all_reduce", 3), "all_reduce #3"),
        (LastCollective("all_reduce", 3, state="completed"), "all_reduce #3, finished"),
        (LastCollective("broadcast", 7, state="started"), "broadcast #7, not finished"),
        (LastCollective("send", 2, point_to_point=True), "send #2 (point-to-point)"),
        (LastCollective("all_gather", 1, group="tp"), "all_gather #1 of group tp"),
    ],
)
def test_a_collective_is_said_with_what_is_known_of_it(
    collective: LastCollective, said: str
) -> None:
    assert collective.describe() == said
    assert LastCollective.from_json(json.dumps(dataclasses.asdict(collective))) == collective


@pytest.mark.parametrize("text", ["null", "", "{", '{"op": "x"}', "[1, 2]"])
def test_an_answer_that_is_not_a_collective_is_none(text: str) -> None:
    assert LastCollective.from_json(text) is None


def test_a_rank_answers_through_its_pipe_and_an_absent_one_is_not_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(collective_trail, "last_collective", lambda: LastCollective("gather", 4))
    folder = str(tmp_path)
    pipe, answer = collective_trail.request_file(folder, 0), answer_file(folder, 0)
    os.mkfifo(pipe)
    listening = threading.Thread(target=collective_trail.answer_once, args=(pipe, answer))
    listening.start()
    try:
        assert not _ask_collective(folder, 1)  # rank 1 has no pipe: not asked, not waited for
        asked = False
        while not asked:  # the thread may not be reading yet: asking fails until it is
            asked = _ask_collective(folder, 0)
            listening.join(0.01)
        assert _read_collectives(folder, [0], deadline=time.monotonic() + 30) == {
            0: LastCollective("gather", 4)
        }
    finally:
        if listening.is_alive():  # never asked: open the pipe for it, so that it returns
            os.close(os.open(pipe, os.O_WRONLY))
        listening.join(30)
    assert not listening.is_alive()
    assert json.loads(Path(answer).read_text())["sequence"] == 4


def test_a_timeout_says_which_collective_the_timed_out_ranks_were_in() -> None:
    log = FailureLog()
    for rank in (0, 2):
        log.timeout_ranks.add(rank)
        log.add(
            WorkerFailure(
                rank,
                "builtins.RuntimeError",
                "Timed out waiting 2000ms for recv operation",
                "",
                collective="all_reduce #5",
            )
        )
    error = log.exception(3, {1: "was still running; last collective: all_reduce #4"}, 2.0)
    assert isinstance(error, CollectiveTimeoutError)
    assert "on ranks 0, 2 of 3 (in all_reduce #5)." in str(error)
    assert "(was still running; last collective: all_reduce #4)" in str(error)


def test_ranks_timed_out_in_different_collectives_are_each_named() -> None:
    log = FailureLog()
    for rank, collective in ((0, "all_reduce #5"), (1, "broadcast #4"), (2, "")):
        log.timeout_ranks.add(rank)
        log.add(
            WorkerFailure(rank, "builtins.RuntimeError", "Timed out", "", collective=collective)
        )
    message = str(log.exception(3, {}, 2.0))
    assert "of 3 (rank 0 in all_reduce #5, rank 1 in broadcast #4)." in message


def test_an_abort_request_calls_the_rank_s_abort_and_writes_no_answer(tmp_path: Path) -> None:
    folder = str(tmp_path)
    pipe, answer = collective_trail.request_file(folder, 0), answer_file(folder, 0)
    os.mkfifo(pipe)
    aborted = threading.Event()
    listening = threading.Thread(
        target=collective_trail.answer_once, args=(pipe, answer, aborted.set)
    )
    listening.start()
    try:
        while not aborted.is_set() and listening.is_alive():
            abort_collectives(folder, [0, 1])  # rank 1 has no pipe: left alone
            listening.join(0.01)
    finally:
        if listening.is_alive():
            os.close(os.open(pipe, os.O_WRONLY))
        listening.join(30)
    assert aborted.is_set() and not Path(answer).exists()


def test_a_rank_whose_collective_the_kernel_aborted_is_shown_stopped_by_the_failure() -> None:
    def failure(rank: int, error: BaseException) -> WorkerFailure:
        kind = type(error)
        return WorkerFailure(rank, f"{kind.__module__}.{kind.__qualname__}", str(error), "", error)

    regroup._aborted_for_peer.set()
    waited = regroup.take_abort_for_peer(RuntimeError("NCCL communicator was aborted"))
    assert isinstance(waited, regroup.PeerFailed) and not regroup._aborted_for_peer.is_set()
    assert regroup.take_abort_for_peer(KeyError("k")).__class__ is KeyError  # not aborted
    log = FailureLog()
    log.add(failure(0, waited))
    log.add(failure(1, NameError("name 'x' is not defined")))
    error = log.exception(2, {}, 60.0)
    assert isinstance(error, NameError)
    assert "Rank 0 was stopped by this failure." in "\n".join(error.__notes__)
