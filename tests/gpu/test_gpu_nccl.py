"""NCCL process groups (skipped without CUDA): each is bound to its rank's GPU and made at once,
its store waits as long as the launch's timeout, and a rank that reaches the first collective
late is waited for."""

from __future__ import annotations

import time

import pytest
import torch

from nb_accel import Accelerator, _env, notebook_launcher

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_env.cuda_device_count() == 0, reason="needs a CUDA GPU"),
]
two_gpus = pytest.mark.skipif(_env.cuda_device_count() < 2, reason="needs two CUDA GPUs")


def group_binding() -> tuple[str, str, float]:
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    Accelerator()
    group = distributed_c10d._get_default_group()
    store = distributed_c10d._get_default_store()
    return dist.get_backend(), str(group.bound_device_id), store.timeout.total_seconds()


def test_each_rank_s_group_is_bound_to_its_gpu_and_its_store_waits_the_launch_timeout() -> None:
    count = _env.cuda_device_count()
    results = notebook_launcher(group_binding, num_processes=count, timeout=1234)
    assert results == [("nccl", f"cuda:{rank}", 1234.0) for rank in range(count)]
    assert not torch.cuda.is_initialized()  # the launcher never touched CUDA in this process


def rank_zero_downloads_first(seconds: float) -> float:
    import torch.distributed as dist

    accelerator = Accelerator()
    with accelerator.main_process_first():
        if accelerator.is_main_process:
            time.sleep(seconds)  # a model download, say
    value = torch.ones(1, device=accelerator.device)
    dist.all_reduce(value)
    return value.item()


@two_gpus
@pytest.mark.timeout(300)
def test_a_rank_late_at_the_first_collective_is_waited_for() -> None:
    assert notebook_launcher(rank_zero_downloads_first, args=(5.0,), num_processes=2) == [2.0, 2.0]
