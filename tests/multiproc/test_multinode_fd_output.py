"""Multi-node: what a worker writes below Python (C libraries, ``os.write``) reaches its node's
kernel with the rank's prefix, also right before the worker aborts. Two "nodes" on this
machine, each a process running ``notebook_launcher(..., num_nodes=2)``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from ports import free_port

NODE = """
import os, sys
from nb_accel import notebook_launcher

def below_python():
    import ctypes
    import torch.distributed as dist
    rank = dist.get_rank()
    ctypes.CDLL(None).printf(b"printf on rank %d\\n", ctypes.c_int(rank))
    ctypes.CDLL(None).fflush(None)
    dist.barrier()
    if rank == 1:
        os.write(2, sys.argv[3].encode())
        os.abort()
    dist.barrier()  # rank 0 learns at once that rank 1 went away
    return rank

if __name__ == "__main__":
    try:
        notebook_launcher(
            below_python, num_processes=1, num_nodes=2, node_rank=int(sys.argv[1]),
            rdzv_endpoint=sys.argv[2],
        )
    except Exception as error:
        print("raised", type(error).__name__, flush=True)
"""

NODE_TIMEOUT_S = 120


def _run_nodes(tmp_path: os.PathLike[str], last_words: str) -> list[str]:
    """Both nodes' output; rank 1 writes ``last_words`` to its fd 2 and aborts."""
    script = os.path.join(tmp_path, "node.py")
    with open(script, "w") as handle:
        handle.write(NODE)
    endpoint = f"127.0.0.1:{free_port()}"
    nodes = [
        subprocess.Popen(
            [sys.executable, script, str(node), endpoint, last_words],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
        )
        for node in (0, 1)
    ]
    outputs = []
    for node in nodes:
        try:
            output, _ = node.communicate(timeout=NODE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for other in nodes:
                other.kill()
                other.communicate()
            pytest.fail("a node did not finish")
        outputs.append(output.decode(errors="replace"))
    return outputs


@pytest.mark.timeout(200)
def test_native_output_and_last_words_reach_each_node_s_kernel(tmp_path: os.PathLike[str]) -> None:
    first, second = _run_nodes(tmp_path, "last words of rank 1\n")
    assert "[rank 0] printf on rank 0\n" in first, first
    assert "[rank 1] printf on rank 1\n" in second, second
    assert "[rank 1] last words of rank 1\n" in second, second
    assert "raised WorkerDiedError" in second, second


#: What NCCL's watchdog writes (torch 2.x) before it aborts a process, here from rank 1.
WATCHDOG_TEXT = (
    "[rank1]:[E1124 07:10:06.885638456 ProcessGroupNCCL.cpp:2197] [PG ID 0 PG GUID "
    "0(default_pg) Rank 1] Process group watchdog thread terminated with exception: [Rank 1] "
    "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, "
    "NumelIn=4, NumelOut=4, Timeout(ms)=5000) ran for 5004 milliseconds before timing out.\n"
)


@pytest.mark.timeout(200)
def test_a_watchdog_abort_on_another_node_is_a_collective_timeout(
    tmp_path: os.PathLike[str],
) -> None:
    _first, second = _run_nodes(tmp_path, WATCHDOG_TEXT)
    assert "raised CollectiveTimeoutError" in second, second
