"""A kernel that used OpenMP threads can still fork workers that use several threads.

GNU OpenMP keeps its thread pool's bookkeeping across ``fork`` but not the threads; without
the launcher releasing the pool first, the worker below waits forever in its first parallel
region (the test's timeout then fails it).
"""

from __future__ import annotations

import pytest
import torch

from nb_accel import notebook_launcher
from nb_accel._openmp import loaded_openmp_libraries, release_openmp_threads


def _threaded_bf16_work() -> float:
    torch.set_num_threads(2)
    x = torch.randn(256, 256)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = torch.nn.functional.linear(x, x)
    return float(y.float().abs().sum())


def _use_openmp_threads_here() -> None:
    torch.set_num_threads(2)
    a = torch.randn(1500, 1500)
    (a @ a).sum()
    (a.bfloat16() @ a.bfloat16()).sum()


@pytest.mark.timeout(60)
def test_a_forked_worker_runs_threaded_bf16_after_the_kernel_used_openmp() -> None:
    threads = torch.get_num_threads()
    try:
        _use_openmp_threads_here()
        [value] = notebook_launcher(_threaded_bf16_work, num_processes=1, timeout=30)
    finally:
        torch.set_num_threads(threads)
    assert value > 0


@pytest.mark.timeout(60)
def test_the_pool_is_released_in_every_loaded_runtime() -> None:
    threads = torch.get_num_threads()
    try:
        _use_openmp_threads_here()
        expected = len(loaded_openmp_libraries())
        assert release_openmp_threads() == expected
        _use_openmp_threads_here()  # the kernel's own next parallel region still works
    finally:
        torch.set_num_threads(threads)
