"""Multi-node: what a worker writes below Python (C libraries, ``os.write``) reaches its node's
kernel with the rank's prefix, also right before the worker aborts. Two "nodes" on this
machine, each a process running ``notebook_launcher(..., num_nodes=2)``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

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
        os.write(2, b"last words of rank 1\\n")
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


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.timeout(200)
def test_native_output_and_last_words_reach_each_node_s_kernel(tmp_path: os.PathLike[str]) -> None:
    script = os.path.join(tmp_path, "node.py")
    with open(script, "w") as handle:
        handle.write(NODE)
    endpoint = f"127.0.0.1:{_free_port()}"
    nodes = [
        subprocess.Popen(
            [sys.executable, script, str(node), endpoint],
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
    first, second = outputs
    assert "[rank 0] printf on rank 0\n" in first, first
    assert "[rank 1] printf on rank 1\n" in second, second
    assert "[rank 1] last words of rank 1\n" in second, second
    assert "raised WorkerDiedError" in second, second
