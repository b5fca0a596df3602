"""``InitProcessGroupKwargs`` in a launch, whose process group exists before the function runs:
its timeout bounds the collectives that follow, its backend is checked against the launch's."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from nb_accel import Accelerator, CollectiveTimeoutError, InitProcessGroupKwargs, notebook_launcher


def late_barrier(seconds: float) -> str:
    handler = InitProcessGroupKwargs(timeout=timedelta(seconds=seconds))
    accelerator = Accelerator(cpu=True, kwargs_handlers=[handler])
    if accelerator.process_index == 1:
        time.sleep(10)  # longer than the handler's timeout, far shorter than the launch's
    accelerator.wait_for_everyone()
    return "both arrived"


@pytest.mark.timeout(120)
def test_the_handlers_timeout_bounds_later_collectives() -> None:
    with pytest.raises(CollectiveTimeoutError) as info:
        notebook_launcher(late_barrier, args=(2,), num_processes=2, timeout=600)
    message = str(info.value)
    assert "rank 0 of 2" in message
    # The message quotes the timeout in force and the knob that set it, not the launch's.
    assert "timed out after 2 s" in message
    assert "InitProcessGroupKwargs" in message and "`timeout=`" not in message


@pytest.mark.timeout(120)
def test_a_longer_timeout_lets_a_late_rank_arrive() -> None:
    results = notebook_launcher(late_barrier, args=(120,), num_processes=2, timeout=600)
    assert results == ["both arrived", "both arrived"]


def with_backend(backend: str) -> str:
    Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(backend=backend)])
    return str(dist.get_backend())


def test_the_launchs_backend_or_the_default_is_accepted() -> None:
    assert notebook_launcher(with_backend, args=("gloo",), num_processes=2) == ["gloo", "gloo"]
    assert notebook_launcher(with_backend, args=("nccl",), num_processes=2) == ["gloo", "gloo"]


def test_another_backend_is_refused_with_the_way_to_choose_it() -> None:
    with pytest.raises(ValueError) as info:
        notebook_launcher(with_backend, args=("mpi",), num_processes=2)
    message = str(info.value)
    assert "InitProcessGroupKwargs(backend='mpi')" in message
    # both ranks raise it; the second may be stopped by the first's failure before it does
    assert "Raised on rank" in "\n".join(info.value.__notes__)
    assert "already uses 'gloo'" in message
    assert "notebook_launcher(..., cpu=True)" in message
