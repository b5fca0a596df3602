"""Heavy worker output in a real kernel: a few stream messages, every line once, in order."""

from __future__ import annotations

from typing import Any

import pytest
from jupyter_client.blocking import BlockingKernelClient
from kernel_driver import cell_messages, run_cell, running_kernel, start_cell

LINES = 3000

CHATTY = f"""
from nb_accel import notebook_launcher

def chatty():
    import torch.distributed as dist
    rank = dist.get_rank()
    for i in range({LINES}):
        print(f"line {{i}} of rank {{rank}}")

notebook_launcher(chatty, num_processes=2);
"""

LAST_WORDS = """
def last_words():
    import torch.distributed as dist
    print("before the error")
    if dist.get_rank() == 1:
        raise ValueError("bad batch")

notebook_launcher(last_words, num_processes=2)
"""


def iopub_messages(client: BlockingKernelClient, msg_id: str) -> list[dict[str, Any]]:
    """Every iopub message of the cell ``msg_id``, until the kernel is idle again."""
    return list(cell_messages(client, msg_id))


def stream_text(messages: list[dict[str, Any]], name: str) -> str:
    return "".join(
        m["content"]["text"]
        for m in messages
        if m["msg_type"] == "stream" and m["content"]["name"] == name
    )


@pytest.mark.timeout(180)
def test_thousands_of_lines_arrive_in_few_messages_each_once_in_order() -> None:
    with running_kernel() as (_, client):
        messages = iopub_messages(client, start_cell(client, CHATTY))
        streams = [m for m in messages if m["msg_type"] == "stream"]
        assert not [m for m in messages if m["msg_type"] == "error"]
        assert len(streams) < 100, f"{len(streams)} stream messages for {2 * LINES} lines"
        lines = stream_text(messages, "stdout").splitlines()
        for rank in (0, 1):
            mine = [line for line in lines if line.startswith(f"[rank {rank}] ")]
            assert mine == [f"[rank {rank}] line {i} of rank {rank}" for i in range(LINES)]
        assert len(lines) == 2 * LINES  # nothing else, nothing twice


@pytest.mark.timeout(180)
def test_output_printed_before_a_failure_comes_before_the_error() -> None:
    with running_kernel() as (_, client):
        start_cell(client, "from nb_accel import notebook_launcher")
        messages = iopub_messages(client, start_cell(client, LAST_WORDS))
        kinds = [m["msg_type"] for m in messages]
        assert "error" in kinds
        text = stream_text(messages[: kinds.index("error")], "stdout")
        assert "[rank 0] before the error" in text and "[rank 1] before the error" in text


LOGGING_SET_UP_IN_THE_KERNEL = """
import logging
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
import torch.distributed as dist
from nb_accel import notebook_launcher

def train():
    print("printed by", dist.get_rank())
    logging.getLogger("mine").warning("logged by %d", dist.get_rank())

notebook_launcher(train, num_processes=2, reuse_workers=WARM)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_a_kernel_log_handler_writes_each_ranks_records_as_its_output(warm: bool) -> None:
    source = LOGGING_SET_UP_IN_THE_KERNEL.replace("WARM", str(warm))
    with running_kernel() as (_, client):
        run = run_cell(client, source)
    assert run.status == "ok", run
    for rank in (0, 1):  # prefixed by its rank, as what it printed is
        assert f"[rank {rank}] WARNING mine: logged by {rank}\n" in run.stderr, run.stderr
    assert "\nWARNING mine" not in "\n" + run.stderr  # none bypassed the rank's relay
