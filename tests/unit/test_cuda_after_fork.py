"""CUDA initialised in the kernel behind torch's back: found by asking a forked child, never by
touching CUDA in the kernel; a default launch then starts its workers another way, an explicit
``fork`` is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from plans import plan_of

from nb_accel import LaunchError
from nb_accel.launch.multinode.elastic_agent import launch_config
from nb_accel.launch.placement.nodes import make_node_plan
from nb_accel.runtime.device_types import cuda_facts, cuda_fork


@pytest.fixture
def two_gpus_and_a_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two GPUs, and the CUDA driver library loaded in this process (so a child is asked); the
    forked child inherits the count its CUDA runtime gives (a CUDA build of torch on a machine
    without GPUs would count none), and is no bad fork (whatever the tests before did here)."""
    monkeypatch.setattr(cuda_facts, "cuda_device_count", lambda: 2)
    monkeypatch.setattr(cuda_fork, "driver_loaded", lambda: True)
    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", lambda: 2, raising=False)
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: False)


@pytest.fixture
def kernel_touched_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """What torch shows a child forked after ``torch.cuda.is_available()`` ran in its parent:
    the child is a bad fork, while ``torch.cuda.is_initialized()`` stays False here."""
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: True)
    assert not torch.cuda.is_initialized()


def test_the_forked_child_reports_a_bad_fork(kernel_touched_cuda: None) -> None:
    assert cuda_fork.ask_forked_child() == cuda_fork.ForkedCuda(bad_fork=True, device_count=-1)


def test_a_default_launch_falls_back_to_forkserver_and_says_so(
    two_gpus_and_a_driver: None, kernel_touched_cuda: None
) -> None:
    plan = plan_of(num_processes=2, cpu=False)
    assert (plan.start_method, plan.device_type, plan.num_processes) == ("forkserver", "cuda", 2)
    [note] = plan.notes
    assert note.startswith(
        "CUDA was initialised in this kernel ("
    )  # who did it: see test_cuda_origin
    # a launch goes to warm workers, started once (a fresh forkserver per launch costs 2 s)
    assert "launches run on warm workers, started once with forkserver instead of fork" in note
    assert (
        plan_of(num_processes=2, cpu=False, reuse_workers=False)
        .notes[0]
        .endswith(
            "forkserver instead of fork: about 2 s more per launch (each launch starts a fresh "
            "interpreter that imports torch)"
        )
    )
    assert "\n" not in note


def test_an_explicit_fork_keeps_the_clear_error(
    two_gpus_and_a_driver: None, kernel_touched_cuda: None
) -> None:
    with pytest.raises(LaunchError) as info:
        plan_of(num_processes=2, start_method="fork", cpu=False)
    assert "Restart the kernel" in str(info.value)
    assert "start_method='spawn' or 'forkserver'" in str(info.value)
    assert plan_of(num_processes=2, start_method="spawn", cpu=False).start_method == "spawn"


def test_fork_stays_when_the_forked_child_can_use_cuda(two_gpus_and_a_driver: None) -> None:
    plan = plan_of(num_processes=2, cpu=False)
    assert (plan.start_method, plan.notes) == ("fork", ())


def test_without_the_driver_loaded_no_child_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_child() -> None:
        raise AssertionError("a child was forked although CUDA cannot have been initialised")

    monkeypatch.setattr(cuda_facts, "cuda_device_count", lambda: 2)
    monkeypatch.setattr(cuda_fork, "driver_loaded", lambda: False)
    monkeypatch.setattr(cuda_fork, "ask_forked_child", no_child)
    assert plan_of(num_processes=2, cpu=False).start_method == "fork"


def test_the_device_count_never_asks_the_cuda_runtime_in_this_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where NVML cannot count, the CUDA runtime counts in a forked child: asking it here
    (``cudaGetDeviceCount``) would leave every forked worker unable to use CUDA."""
    asked_in: list[int] = []

    def runtime_count() -> int:
        asked_in.append(os.getpid())
        return 3

    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: -1)  # e.g. MIG ids
    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", runtime_count, raising=False)
    # this process as a kernel that never touched CUDA (a test before may have, on a CUDA build)
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: False)
    monkeypatch.setattr(cuda_facts, "cuda_initialized", lambda: False)
    assert cuda_facts.cuda_device_count() == 3
    assert asked_in == []  # the count came from the child; this process never asked


@pytest.mark.parametrize(("before", "after"), [(None, "1"), ("0", "0")])
def test_importing_nb_accel_makes_is_available_ask_nvml(before: str | None, after: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_NVML_BASED_CUDA_CHECK"}
    if before is not None:
        env["PYTORCH_NVML_BASED_CUDA_CHECK"] = before
    code = "import os, nb_accel; print(os.environ.get('PYTORCH_NVML_BASED_CUDA_CHECK'))"
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == after


def test_torch_s_launch_config_asks_nothing_of_cuda_in_this_process(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A multi-node launch makes torch's ``LaunchConfig`` in the kernel, which asks
    ``torch.cuda.is_available()`` for its NUMA binding: answered without touching CUDA here,
    torch's own functions are never called and stay in place."""
    asked: list[str] = []
    is_available, device_count = torch.cuda.is_available, torch.cuda.device_count
    monkeypatch.setattr(torch.cuda, "is_available", lambda: asked.append("is_available") or False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: asked.append("device_count") or 0)
    monkeypatch.setattr(cuda_facts, "cuda_device_count", lambda: 0)
    nodes = make_node_plan(2, 1, "127.0.0.1:29500", "c10d", 0, 30)
    replaced = torch.cuda.is_available, torch.cuda.device_count
    config = launch_config(nodes, 2, "fork", str(tmp_path))
    assert config.nproc_per_node == 2 and config.numa_options is None
    assert asked == []
    assert (torch.cuda.is_available, torch.cuda.device_count) == replaced
    assert (is_available, device_count) != replaced  # the test's own stand-ins were in place
