"""A launch on a Ray cluster's GPUs (skipped without CUDA or without Ray): a one-node cluster of
this machine's GPUs (Ray's own ``ray start --head``, its files in the test's folder), a kernel
that connects to it, every GPU a rank: each rank sees the GPU its bundle holds
(``CUDA_VISIBLE_DEVICES`` from Ray), NCCL reduces across them, and nothing is left after."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ports import free_port

from nb_accel.runtime.device_types import cuda_facts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(300),
    pytest.mark.skipif(cuda_facts.cuda_device_count() == 0, reason="needs a CUDA GPU"),
]

KERNEL = """
import json, os
import ray
import torch, torch.distributed as dist
from nb_accel import notebook_launcher

def on_its_gpu():
    value = torch.ones(1, device="cuda") * (dist.get_rank() + 1)
    dist.all_reduce(value)
    return os.environ.get("CUDA_VISIBLE_DEVICES"), dist.get_backend(), value.item()

ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR")
count = int(ray.cluster_resources()["GPU"])
results = notebook_launcher(on_its_gpu, num_processes=count, hosts="ray")
left = [g["state"] for g in ray.util.placement_group_table().values() if g["state"] != "REMOVED"]
print("OUTCOME", json.dumps({"count": count, "results": results, "left": left}))
"""


def test_each_rank_on_a_ray_cluster_has_its_bundle_s_gpu(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="needs Ray (the ray extra)")
    ray_program = Path(sys.executable).with_name("ray")
    count = cuda_facts.cuda_device_count()
    port = free_port()
    env = {**os.environ, "RAY_ADDRESS": f"127.0.0.1:{port}", "TMPDIR": str(tmp_path)}
    head = subprocess.Popen(
        [
            str(ray_program),
            *("start", "--head", "--block", "--disable-usage-stats"),
            *(f"--port={port}", "--node-ip-address=127.0.0.1", f"--num-gpus={count}"),
            *(f"--num-cpus={count}", "--include-dashboard=false"),
            f"--temp-dir={tmp_path / 'ray'}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        script = tmp_path / "kernel.py"
        script.write_text(KERNEL)
        deadline = time.monotonic() + 120
        while True:  # until the head answers (the kernel's connection is the probe)
            done = subprocess.run(
                [sys.executable, str(script)],
                capture_output=True,
                text=True,
                timeout=240,
                env=env,
                cwd=tmp_path,
                check=False,
            )
            if done.returncode == 0 or time.monotonic() > deadline or head.poll() is not None:
                break
            time.sleep(1)  # polling the head's start, not ordering events
        assert done.returncode == 0, done.stdout + done.stderr
        line = next(x for x in done.stdout.splitlines() if x.startswith("OUTCOME "))
        outcome = json.loads(line.removeprefix("OUTCOME "))
        total = count * (count + 1) / 2
        assert outcome["count"] == count
        assert [backend for _, backend, _ in outcome["results"]] == ["nccl"] * count
        assert [value for _, _, value in outcome["results"]] == [total] * count
        visible = [devices for devices, _, _ in outcome["results"]]
        assert visible[0] is not None and len(visible[0].split(",")) == count, visible
        assert outcome["left"] == []
    finally:
        stopper = shutil.which("ray") or str(ray_program)
        subprocess.run(
            [stopper, "stop", "--force"], capture_output=True, timeout=60, check=False, env=env
        )
        if head.poll() is None:
            os.killpg(head.pid, signal.SIGKILL)
        head.communicate(timeout=30)
