"""A launch from a kernel whose forked children could not use CUDA starts its workers with
forkserver instead, once: they stay warm for the next launches (a fresh forkserver per launch
costs about 2 s each), says so in one line, and returns the right result;
``reuse_workers=False`` starts fresh ones at each launch."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

import nb_accel
from nb_accel import notebook_launcher
from nb_accel.launch import launcher
from nb_accel.launch.plan import LaunchPlan
from nb_accel.launch.spec import LaunchSpec
from nb_accel.runtime.device_types import cuda_facts, cuda_fork


def sum_of_ranks(offset: int) -> tuple[int, float, int]:
    value = torch.tensor([float(dist.get_rank() + offset)])
    dist.all_reduce(value)
    return os.getppid(), value.item(), os.getpid()


@pytest.fixture(autouse=True)
def _no_warm_workers_left() -> Iterator[None]:
    yield
    nb_accel.stop_workers()


def _kernel_with_cuda_initialised(monkeypatch: pytest.MonkeyPatch) -> list[LaunchPlan]:
    # Two GPUs, the CUDA driver loaded, and a child forked from here is a bad fork: what a
    # kernel that ran torch.cuda.is_available() before importing nb_accel shows.
    monkeypatch.delenv("NB_ACCEL_USE_CPU", raising=False)
    monkeypatch.setattr(cuda_facts, "cuda_device_count", lambda: 2)
    monkeypatch.setattr(cuda_fork, "driver_loaded", lambda: True)
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: True)
    planned: list[LaunchPlan] = []
    real_resolve = launcher.resolve_spec

    def on_the_cpu(*args: Any, **kwargs: Any) -> LaunchSpec:
        """The real spec, with its workers on the CPU (gloo): this machine has no GPU."""
        spec = real_resolve(*args, **kwargs)
        planned.append(spec.plan)
        plan = dataclasses.replace(spec.plan, device_type="cpu", backend="gloo")
        return dataclasses.replace(spec, plan=plan)

    monkeypatch.setattr(launcher, "resolve_spec", on_the_cpu)
    return planned


@pytest.mark.timeout(120)
def test_a_default_launch_goes_to_warm_workers_started_by_forkserver_with_a_note(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    planned = _kernel_with_cuda_initialised(monkeypatch)
    results = notebook_launcher(sum_of_ranks, args=(10,), num_processes=2)
    assert planned[0].start_method == "forkserver" and planned[0].device_type == "cuda"
    assert [value for _, value, _ in results] == [21.0, 21.0]
    assert all(parent != os.getpid() for parent, _, _ in results)  # forked by the fork server
    err = capsys.readouterr().err
    assert err.count("instead of fork") == 1
    [line] = [line for line in err.splitlines() if "instead of fork" in line]
    assert line.startswith("CUDA was initialised in this kernel")
    assert "launches run on warm workers, started once with forkserver instead of fork" in line
    again = notebook_launcher(sum_of_ranks, args=(20,), num_processes=2)
    assert [r[2] for r in again] == [r[2] for r in results]  # the same workers, at once
    assert [value for _, value, _ in again] == [41.0, 41.0]


@pytest.mark.timeout(120)
def test_reuse_workers_false_starts_a_fresh_forkserver_launch_each_time(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _kernel_with_cuda_initialised(monkeypatch)
    first = notebook_launcher(sum_of_ranks, args=(10,), num_processes=2, reuse_workers=False)
    second = notebook_launcher(sum_of_ranks, args=(10,), num_processes=2, reuse_workers=False)
    assert not {r[2] for r in first} & {r[2] for r in second}
    assert nb_accel.launch.warm.kept.kept_pool() is None
    err = capsys.readouterr().err
    assert err.count("starting workers with forkserver instead of fork: about 2 s more") == 2
