"""One "node" of a multi-node launch, run as its own process by test_multinode.py.

Usage: ``python multinode_node.py NODE_RANK ENDPOINT SCENARIO OUT_FILE [OPTION=VALUE ...]``
(each VALUE read as JSON, else as a string). The node launches 2 processes and writes what its
``notebook_launcher`` call returned or raised to ``OUT_FILE`` as JSON. ``SCENARIO`` may name
several launches, one after the other (``fail,ok``): a node starts the next once every node's
launch before it has ended, as the markers in :data:`RUNS_FOLDER` say.
"""

from __future__ import annotations

import builtins
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import nb_accel

#: The folder the ``trackers`` scenario's runs go to (and its MLflow store, by
#: ``MLFLOW_TRACKING_URI``), given by the test.
TRACKERS_FOLDER = "NB_ACCEL_TEST_TRACKERS_FOLDER"
#: The folder where the ``sleep`` scenario's ranks each write ``rank<N>-asleep`` as they start
#: sleeping, given by the test; they sleep until a file ``wake`` is there (20 s at most).
ASLEEP_FOLDER = "NB_ACCEL_TEST_ASLEEP_FOLDER"
#: The folder where each node writes ``<OUT_FILE's name>.run<N>-started`` as it starts its
#: launch number N and ``<OUT_FILE's name>.run<N>-ended`` once that launch has returned or
#: raised, given by the test (a scenario of several launches needs it).
RUNS_FOLDER = "NB_ACCEL_TEST_RUNS_FOLDER"
#: The longest a node waits for the other nodes' markers (a bound against hanging, below the
#: test's wait for the node, so that the node says what it waited for).
MARKER_WAIT_S = 60.0
#: Where given, how long each node's agent waits at the exit barrier for the other nodes
#: (seconds), in place of the product's bound.
EXIT_BARRIER = "NB_ACCEL_TEST_EXIT_BARRIER_S"


def run_marker(folder: str, out: str, number: int, event: str) -> Path:
    """The marker a node whose record goes to ``out`` writes when its launch ``number`` has
    ``event`` (``"started"``, ``"ended"``)."""
    return Path(folder, f"{Path(out).name}.run{number}-{event}")


def _after_every_node_ended(folder: str, number: int, nodes: int) -> None:
    """Wait until ``nodes`` nodes have written that their launch ``number`` ended."""
    deadline = time.monotonic() + MARKER_WAIT_S
    while len(list(Path(folder).glob(f"*.run{number}-ended"))) < nodes:
        if time.monotonic() > deadline:
            raise TimeoutError(f"not every node's launch {number} ended within {MARKER_WAIT_S} s")
        time.sleep(0.01)


def log_then_fail(folder: str, project: str) -> None:
    """TensorBoard and MLflow runs of three steps (``project`` in ``folder``); then rank 0
    raises, without ending them, while the others wait for it."""
    accelerator = nb_accel.Accelerator(log_with=["tensorboard", "mlflow"], project_dir=folder)
    accelerator.init_trackers(project, config={"lr": 0.1})
    for step in range(3):
        accelerator.log({"loss": float(step)}, step=step)
    if accelerator.is_main_process:
        raise RuntimeError("stopped mid-run")
    accelerator.wait_for_everyone()  # the other ranks fail when rank 0 is gone


def open_a_run_each_then_die_on_rank_3() -> None:
    """Every rank opens an MLflow run of its own (the store in ``MLFLOW_TRACKING_URI``); once
    all are open, rank 3 (on node 1) dies at once (SIGKILL: its run stays open)."""
    from nb_accel.tracking import MLflowTracker

    class RunPerRank(MLflowTracker):
        main_process_only = False

    accelerator = nb_accel.Accelerator(log_with=[RunPerRank("killed")])
    accelerator.init_trackers("killed", config={"rank": accelerator.process_index})
    accelerator.wait_for_everyone()
    if accelerator.process_index == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    accelerator.wait_for_everyone()  # the others fail when rank 3 is gone


def work(scenario: str) -> dict[str, Any] | None:
    """Every rank: an all-reduce over all ranks, then the scenario's twist."""
    if scenario == "trackers":
        log_then_fail(os.environ[TRACKERS_FOLDER], "two-nodes")
        return None
    if scenario == "killed_run":
        open_a_run_each_then_die_on_rank_3()
        return None
    accelerator = nb_accel.Accelerator()
    rank = accelerator.process_index
    if scenario == "say":
        print(f"hello from rank {rank}", flush=True)
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if scenario == "fail" and rank == 3:
        raise ValueError("rank 3 cannot go on")
    if scenario == "die" and rank == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    if scenario == "stuck" and accelerator.local_process_index == rank:  # node 0's ranks
        loop_in_own_code(30.0)
    if scenario == "frozen" and accelerator.local_process_index == rank:  # node 0's ranks
        if rank == 0:
            os.kill(os.getpid(), signal.SIGSTOP)  # frozen until the agent stops it
        loop_in_own_code(30.0)
    if scenario == "restart" and rank == 3 and attempt == 0:
        raise RuntimeError("first attempt fails")
    if scenario == "late":
        pids = accelerator.gather(torch.tensor([os.getpid()])).tolist()
        if accelerator.local_process_index == rank:  # node 0's ranks come late
            wait_until_ended(pids[accelerator.num_processes // 2 :])
    if scenario == "crossed":  # node 1's ranks wait for a message node 0's never send
        pids = accelerator.gather(torch.tensor([os.getpid()])).tolist()
        half = accelerator.num_processes // 2
        if accelerator.local_process_index == rank:  # node 0's: the barrier, once node 1 ended
            wait_until_ended(pids[half:])
        else:
            dist.recv(torch.zeros(1), src=rank - half)
    if scenario == "sleep":
        print("ready", flush=True)
        folder = os.environ[ASLEEP_FOLDER]
        open(os.path.join(folder, f"rank{rank}-asleep"), "w").close()
        woken_by = time.monotonic() + 20  # the test interrupts a node meanwhile
        while not os.path.exists(os.path.join(folder, "wake")) and time.monotonic() < woken_by:
            time.sleep(0.05)
    if scenario in ("fail", "restart", "sleep", "die", "stuck", "late", "frozen", "crossed"):
        dist.barrier()
    answer = input(f"name of rank {rank}? ") if scenario == "ask" and rank == 3 else ""
    gathered = accelerator.gather(torch.tensor([rank]))
    if scenario == "late_fail" and rank == 3:
        raise ValueError("rank 3 fails after the last collective")
    return {
        "rank": rank,
        "local_rank": accelerator.local_process_index,
        "world": accelerator.num_processes,
        "sum": total.item(),
        "gathered": gathered.tolist(),
        "attempt": attempt,
        "main": accelerator.is_main_process,
        "run_id": os.environ.get("TORCHELASTIC_RUN_ID"),
        "answer": answer,
    }


def loop_in_own_code(seconds: float) -> None:
    """Busy in the rank's own code, never reaching the next collective (for ``seconds`` at
    most: a node never told that the others ended goes on afterwards, and fails)."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        time.sleep(0.05)


def wait_until_ended(pids: list[int]) -> None:
    """Wait until the processes ``pids`` (the other node's ranks, on this machine too) have
    ended, reaped or not: they gave up waiting for this rank (for 30 s at most)."""
    until = time.monotonic() + 30.0
    while time.monotonic() < until and any(_running(pid) for pid in pids):
        time.sleep(0.01)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def use_the_lock_and_the_generator(lock: Any, numbers: Any) -> dict[str, Any]:
    """The ``unpicklable`` scenario: arguments that cannot be pickled, inherited by forked
    workers on every node."""
    with lock:
        return {"rank": nb_accel.PartialState().process_index, "next": next(numbers)}


def _launch(scenario: str, options: dict[str, Any]) -> dict[str, Any]:
    """One launch of this node's share; what it returned or raised, and how long it took."""
    started = time.monotonic()
    function: Callable[..., Any] = work
    arguments: tuple[Any, ...] = (scenario,)
    if scenario == "unpicklable":
        function = use_the_lock_and_the_generator
        arguments = (threading.Lock(), (n for n in (7, 8, 9)))
    try:
        results = nb_accel.notebook_launcher(function, arguments, num_processes=2, **options)
        record: dict[str, Any] = {"results": results}
    except BaseException as error:  # noqa: BLE001 - recorded for the test to check
        record = {
            "error": type(error).__name__,
            "message": str(error),
            "notes": list(getattr(error, "__notes__", [])),
        }
    record["seconds"] = time.monotonic() - started
    return record


def main() -> None:
    """Launch this node's share and record the outcome."""
    node_rank, endpoint, scenario, out = sys.argv[1:5]
    options: dict[str, Any] = {}
    for item in sys.argv[5:]:
        key, _, value = item.partition("=")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    if endpoint != "-":
        options["rdzv_endpoint"] = endpoint
    if node_rank != "-":
        options["node_rank"] = int(node_rank)
    if "ask" in scenario.split(","):  # what the user types at this node's kernel
        builtins.input = lambda prompt="": print(f"asked {prompt!r}", flush=True) or "ada"
    if EXIT_BARRIER in os.environ:
        from nb_accel.launch.multinode import elastic_agent

        elastic_agent.EXIT_BARRIER_S = float(os.environ[EXIT_BARRIER])
    folder = os.environ.get(RUNS_FOLDER)  # only where a test waits for the markers
    runs = []
    for number, one in enumerate(scenario.split(",")):
        if number:  # as a user would: once the launch before has ended on every node
            if folder is None:
                raise RuntimeError(f"several launches need {RUNS_FOLDER}")
            _after_every_node_ended(folder, number - 1, int(options.get("num_nodes", 1)))
        if folder is not None:
            run_marker(folder, out, number, "started").touch()
        runs.append(_launch(one, options))
        if folder is not None:
            run_marker(folder, out, number, "ended").touch()
    record = runs[0] if len(runs) == 1 else {"runs": runs}
    with open(out, "w") as handle:
        json.dump(record, handle)


if __name__ == "__main__":
    main()
