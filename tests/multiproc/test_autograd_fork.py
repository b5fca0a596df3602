"""A kernel whose autograd engine started its device threads (a backward pass after
``torch.compile`` on a CUDA build of torch, as on Colab's CPU runtime) cannot fork workers that
train: a forked child's backward pass raises "Unable to handle autograd's threading in
combination with fork-based multiprocessing". A default launch then starts its workers with
forkserver and says why; an explicit ``fork`` is refused before anything starts.

The threads are found by their names (``pt_autograd_<n>``): a thread of the test named so
stands for them where this torch build starts none; the kernel that compiles and trains runs
in a subprocess, leaving this process as it was.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from plans import plan_of

from nb_accel import LaunchError
from nb_accel._env import autograd_threads_started


@pytest.fixture
def autograd_thread() -> Iterator[None]:
    """A thread of this process named as autograd names its device threads, while the test
    runs."""
    named, done = threading.Event(), threading.Event()

    def run() -> None:
        Path("/proc/thread-self/comm").write_text("pt_autograd_0")
        named.set()
        done.wait(60)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert named.wait(10)
        yield
    finally:
        done.set()
        thread.join(10)


@pytest.mark.timeout(30)
def test_autograd_s_device_threads_are_found_by_their_names(autograd_thread: None) -> None:
    assert autograd_threads_started()


@pytest.mark.timeout(30)
def test_a_default_launch_then_starts_workers_with_forkserver_and_says_why(
    autograd_thread: None,
) -> None:
    plan = plan_of(num_processes=2, cpu=True)
    assert plan.start_method == "forkserver"
    [note] = plan.notes
    assert note.startswith("torch's autograd started its device threads in this kernel (a ")
    assert "so forked workers could not run a backward pass; launches run on warm workers" in note
    cold = plan_of(num_processes=2, cpu=True, reuse_workers=False).notes[0]
    assert "; starting workers with forkserver instead of fork" in cold


@pytest.mark.timeout(30)
def test_an_explicit_fork_is_refused_saying_why(autograd_thread: None) -> None:
    with pytest.raises(LaunchError) as info:
        plan_of(num_processes=2, cpu=True, start_method="fork")
    message = str(info.value)
    assert "so forked workers could not run a backward pass. Restart the kernel" in message
    assert "pass start_method='spawn' or 'forkserver'" in message


def test_without_them_launches_fork() -> None:
    assert not autograd_threads_started()
    assert plan_of(num_processes=2, cpu=True).start_method == "fork"


#: A kernel that compiles a model and trains it for a step, then launches workers that train.
KERNEL = """
import torch, torch.distributed as dist
from nb_accel import notebook_launcher
from nb_accel._env import autograd_threads_started

def step():
    weight = torch.ones(2, requires_grad=True)
    (weight * 2).sum().backward()
    total = weight.grad.sum()
    dist.all_reduce(total)
    return total.item()

if __name__ == "__main__":  # a forkserver's workers import this script as a module
    model = torch.compile(torch.nn.Linear(3, 1))
    model(torch.ones(2, 3)).sum().backward()
    print("threads started:", autograd_threads_started(), flush=True)
    print("results:", notebook_launcher(step, num_processes=2, reuse_workers=False), flush=True)
"""


@pytest.mark.timeout(300)
def test_a_kernel_that_trained_a_compiled_model_launches_workers_that_train(
    tmp_path: Path,
) -> None:
    script = tmp_path / "kernel.py"
    script.write_text(KERNEL)
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "results: [8.0, 8.0]" in done.stdout, done.stdout + done.stderr
    if "threads started: True" in done.stdout:  # this torch build starts them (CUDA builds)
        assert "starting workers with forkserver instead of fork" in done.stderr, done.stderr
    else:
        assert "Launching 2 processes on CPU (gloo; fork)" in done.stdout, done.stdout
