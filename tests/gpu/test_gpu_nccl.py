"""NCCL process groups (skipped without CUDA): each is bound to its rank's GPU and made at once,
its store waits as long as the launch's timeout, a rank that reaches the first collective late
is waited for, and a collective that NCCL's watchdog times out is a ``CollectiveTimeoutError``."""

from __future__ import annotations

import time

import pytest
import torch

from nb_accel import Accelerator, CollectiveTimeoutError, _env, notebook_launcher

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


def rank_one_never_arrives() -> float:
    import torch.distributed as dist

    accelerator = Accelerator()
    value = torch.ones(1, device=accelerator.device)
    dist.all_reduce(value)
    if accelerator.process_index == 1:
        time.sleep(600)  # stopped long before: rank 0's watchdog gives up after the timeout
    dist.all_reduce(value)
    return value.item()  # waits for the all-reduce that never completes


@two_gpus
@pytest.mark.timeout(300)
def test_a_collective_the_watchdog_times_out_is_a_collective_timeout_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(CollectiveTimeoutError, match=r"timed out after 10 s on rank 0 of 2"):
        notebook_launcher(rank_one_never_arrives, num_processes=2, timeout=10)
    err = capsys.readouterr().err
    assert "[rank 0] " in err and "Watchdog caught collective operation timeout" in err
