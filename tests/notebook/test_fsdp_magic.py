"""``%%distributed --fsdp`` through a real kernel: the pool's workers are told to shard, the
line that starts the pool says so, and a restart keeps the setting unless told otherwise."""

from __future__ import annotations

from jupyter_client.blocking import BlockingKernelClient
from kernel_driver import CellRun, run_cell, running_kernel

SEEN = "%%distributed -o seen\nimport os\nos.environ['ACCELERATE_USE_FSDP']"


def _ok(client: BlockingKernelClient, code: str) -> CellRun:
    run = run_cell(client, code)
    assert run.status == "ok", (run.ename, run.evalue, "\n".join(run.traceback))
    return run


def _seen(client: BlockingKernelClient) -> str:
    _ok(client, SEEN)
    return _ok(client, "print(seen)").stdout.strip()


def test_the_pool_shards_with_fsdp_when_asked() -> None:
    with running_kernel() as (_, client):
        _ok(client, "import os\nos.environ['ACCELERATE_USE_FSDP'] = 'true'")  # a leftover
        _ok(client, "%load_ext nb_accel")
        started = _ok(client, "%%distributed -n 2 --no-fsdp\nrank")
        assert "Started 2 processes on CPU (gloo; fork) for %%distributed" in started.stdout
        assert _seen(client) == "['false', 'false']"
        mismatch = run_cell(client, "%%distributed --fsdp\nrank")
        assert mismatch.status == "error"
        assert "the pool runs with sharding ddp; %distributed restart --fsdp" in mismatch.stderr
        restarted = _ok(client, "%distributed restart --fsdp")
        assert "(gloo; fork, FSDP, 2 shards) for %%distributed" in restarted.stdout
        assert _seen(client) == "['true', 'true']"
        sharded = (
            "%%distributed -o kinds\nimport torch\nfrom nb_accel import Accelerator\n"
            "accelerator = Accelerator()\nmodel = accelerator.prepare(torch.nn.Linear(4, 4))\n"
            "(accelerator.distributed_type.value, type(model).__name__)"
        )
        _ok(client, sharded)  # the cells' Accelerator shards what it prepares
        assert _ok(client, "print(kinds)").stdout.strip() == str([("FSDP", "FSDPLinear")] * 2)
        again = _ok(client, "%distributed restart")  # the same settings
        assert "FSDP, 2 shards" in again.stdout
        assert _seen(client) == "['true', 'true']"
        _ok(client, "%distributed stop")
