"""%%distributed on NCCL (skipped without CUDA): an interrupted cell that was busy in
collectives leaves the next cell's collectives right (through a real kernel); a failing rank
frees the ranks that wait for it in an NCCL collective, and the next cell runs on a rebuilt
group; a killed rank is replaced and joins a new NCCL group."""

from __future__ import annotations

import queue
import time

import pytest
from jupyter_client import KernelManager
from jupyter_client.blocking import BlockingKernelClient

from nb_accel.runtime.device_types import cuda_facts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(cuda_facts.cuda_device_count() == 0, reason="needs a CUDA GPU"),
]

#: Says "looping" once 100 all-reduces are queued on the GPU, and goes on for ever: the
#: interrupt then lands with collectives in flight.
LOOP = """%%distributed
import itertools, torch, torch.distributed as dist
for step in itertools.count():
    dist.all_reduce(torch.ones(1 << 20, device=accelerator.device))
    if step == 100:
        print('looping', flush=True)
"""

CHECK = """%%distributed -o sums
import torch, torch.distributed as dist
value = torch.ones(4, device=accelerator.device) * (rank + 1)
dist.all_reduce(value)
value.tolist()
"""


def _run(client: BlockingKernelClient, code: str, until: str | None = None) -> dict[str, str]:
    """Execute ``code``; its status and the text streamed, until idle or ``until``."""
    return _collect(client, client.execute(code, store_history=False), until)


def _collect(client: BlockingKernelClient, msg_id: str, until: str | None = None) -> dict[str, str]:
    """The status and text of cell ``msg_id``, until the kernel is idle or ``until`` shows."""
    text, deadline = "", time.monotonic() + 240
    status: dict[str, str] = {}
    while time.monotonic() < deadline:
        try:
            message = client.get_iopub_msg(timeout=1)
        except queue.Empty:
            continue
        if message["parent_header"].get("msg_id") != msg_id:
            continue
        content = message["content"]
        if message["msg_type"] == "stream":
            text += content["text"]
            if until is not None and until in text:
                return {"status": "running", "text": text, "msg_id": msg_id}
        if message["msg_type"] == "error":
            status = {"status": "error", "ename": content["ename"]}
        if message["msg_type"] == "status" and content["execution_state"] == "idle":
            return {"status": "ok", **status, "text": text}
    raise AssertionError(f"cell {msg_id} did not finish")


@pytest.mark.timeout(400)
def test_an_interrupted_cell_in_collectives_leaves_the_next_cell_right() -> None:
    count = cuda_facts.cuda_device_count()
    manager = KernelManager(kernel_name="python3")
    manager.start_kernel()
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        assert _run(client, "%load_ext nb_accel")["status"] == "ok"
        assert _run(client, f"%%distributed -n {count}\nrank")["status"] == "ok"
        looping = _run(client, LOOP, until="looping")
        assert looping["status"] == "running"
        manager.interrupt_kernel()
        assert _collect(client, looping["msg_id"])["ename"] == "KeyboardInterrupt"
        for _ in range(3):
            assert _run(client, CHECK)["status"] == "ok"
            shown = _run(client, "print(sums)")
            expected = [float(count * (count + 1) / 2)] * 4
            assert shown["text"].strip() == str([expected] * count)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


#: Rank 1 fails before the all-reduce the others wait in: NCCL runs it apart from Python, so
#: those ranks wait in ``.item()``, not inside torch; their flight recorder says they wait.
FAILING = """
import torch, torch.distributed as dist
value = torch.ones(1, device=accelerator.device)
if rank == 1:
    undefined_name
dist.all_reduce(value)
value.item()
"""

two_gpus = pytest.mark.skipif(cuda_facts.cuda_device_count() < 2, reason="needs two CUDA GPUs")


@two_gpus
@pytest.mark.timeout(300)
def test_a_failing_rank_frees_the_ranks_waiting_in_an_nccl_collective() -> None:
    from shown_rows import ShownRows

    from nb_accel.launch.pool import WorkerPool, load_value

    count = cuda_facts.cuda_device_count()
    pool = WorkerPool(count, timeout=600)  # the test's own timeout fails a hang long before
    pool.start()
    shown = ShownRows()
    try:
        with pytest.raises(NameError, match="undefined_name"):
            pool.execute(FAILING, view=shown)
        assert shown.rows[1][0] == "failed"
        assert all(shown.rows[r] == ("stopped", "rank 1 failed") for r in range(count) if r != 1)
        done = pool.execute(CHECK.split("\n", 1)[1], want_value=True)  # a rebuilt group
        expected = [float(count * (count + 1) / 2)] * 4
        assert [load_value(done[r]) for r in range(count)] == [expected] * count
    finally:
        pool.stop()


KILLED = """
import os, signal, torch, torch.distributed as dist
held = torch.ones(1 << 20, device=accelerator.device)  # GPU memory the dead rank gives back
if rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
dist.all_reduce(torch.ones(1, device=accelerator.device))
"""


@two_gpus
@pytest.mark.timeout(300)
def test_a_killed_rank_on_a_gpu_is_replaced_and_joins_a_new_nccl_group() -> None:
    from nb_accel.errors import WorkerDiedError
    from nb_accel.launch.pool import WorkerPool, load_value

    count = cuda_facts.cuda_device_count()
    pool = WorkerPool(count, timeout=600)
    pool.start()
    try:
        with pytest.raises(WorkerDiedError, match="rank 1") as died:
            pool.execute(KILLED)
        assert "Rank 1 died and was replaced" in "\n".join(died.value.__notes__)
        done = pool.execute(CHECK.split("\n", 1)[1], want_value=True)  # the new rank 1 in it
        expected = [float(count * (count + 1) / 2)] * 4
        assert [load_value(done[r]) for r in range(count)] == [expected] * count
    finally:
        pool.stop()
