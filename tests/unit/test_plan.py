"""Bad input fails before any process starts, with a message that says what to do."""

from __future__ import annotations

import threading

import psutil
import pytest
from plans import plan_of

from nb_accel import LaunchError, notebook_launcher
from nb_accel.runtime.device_types import cuda_facts


def _noop() -> int:
    return 0


def _assert_nothing_launched(capsys: pytest.CaptureFixture[str]) -> None:
    assert "Launching" not in capsys.readouterr().out
    assert psutil.Process().children(recursive=True) == []


@pytest.mark.parametrize("bad", [0, -1])
def test_num_processes_below_one_is_a_value_error(
    bad: int, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ValueError, match="num_processes must be a positive int"):
        notebook_launcher(_noop, num_processes=bad)
    _assert_nothing_launched(capsys)


@pytest.mark.parametrize("bad", [1.5, "2", True])
def test_num_processes_of_wrong_type_is_a_type_error(
    bad: object, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(TypeError, match="num_processes must be a positive int"):
        notebook_launcher(_noop, num_processes=bad)  # type: ignore[arg-type]
    _assert_nothing_launched(capsys)


def test_invalid_mixed_precision_names_the_valid_values(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError) as info:
        notebook_launcher(_noop, num_processes=2, mixed_precision="fp8")
    assert all(v in str(info.value) for v in ("'no'", "'bf16'", "'fp16'"))
    _assert_nothing_launched(capsys)


def test_unknown_start_method_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="start_method='thread'"):
        notebook_launcher(_noop, num_processes=2, start_method="thread")
    _assert_nothing_launched(capsys)


@pytest.mark.parametrize("bad", [0, -3, "10"])
def test_bad_timeout_is_rejected(bad: object) -> None:
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        notebook_launcher(_noop, num_processes=2, timeout=bad)  # type: ignore[arg-type]


def test_args_must_be_a_sequence() -> None:
    with pytest.raises(TypeError, match=r"args=\(value,\)"):
        notebook_launcher(_noop, args=5, num_processes=2)  # type: ignore[arg-type]


def test_function_must_be_callable() -> None:
    with pytest.raises(TypeError, match="function must be callable"):
        notebook_launcher(42, num_processes=2)  # type: ignore[arg-type]


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_unpicklable_argument_is_named(
    capsys: pytest.CaptureFixture[str], start_method: str
) -> None:
    """Workers that do not inherit the kernel's memory get the call pickled: what cannot be
    pickled is named before anything starts (forked workers take it as it is: see
    tests/multiproc/test_payload_by_reference.py)."""
    lock = threading.Lock()
    with pytest.raises(TypeError) as info:
        notebook_launcher(
            lambda x, y: x, args=(1, lock), num_processes=2, start_method=start_method
        )
    assert "args[1] (a lock)" in str(info.value)
    assert "inside the launched function" in str(info.value)
    _assert_nothing_launched(capsys)


def test_unpicklable_closure_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    generator = (i for i in range(3))

    def uses_generator() -> int:
        return next(generator)

    with pytest.raises(
        TypeError,
        match="cannot send the variable `generator` from an enclosing function "
        r"\(a generator\), which 'test_unpicklable_closure_is_named.<locals>.uses_generator' uses",
    ):
        notebook_launcher(uses_generator, num_processes=2, start_method="spawn")
    _assert_nothing_launched(capsys)


def test_more_processes_than_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_facts, "cuda_device_count", lambda: 2)
    with pytest.raises(ValueError, match=r"num_processes=4 but only 2 GPUs are visible.*cpu=True"):
        plan_of(num_processes=4, cpu=False)
    plan = plan_of(timeout=60, cpu=False)
    assert (plan.num_processes, plan.backend, plan.device_type) == (2, "nccl", "cuda")
    assert plan_of(num_processes=4, cpu=True).backend == "gloo"


def test_cuda_initialised_before_fork_says_how_to_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_facts, "cuda_device_count", lambda: 1)
    monkeypatch.setattr(cuda_facts, "cuda_initialized", lambda: True)
    with pytest.raises(LaunchError) as info:
        plan_of(num_processes=1, start_method="fork", cpu=False)
    assert "Restart the kernel" in str(info.value) and "start_method='spawn'" in str(info.value)
    assert plan_of(num_processes=1, start_method="spawn", cpu=False).start_method == "spawn"


def test_plan_describes_the_launch_truthfully() -> None:
    plan = plan_of(num_processes=2, start_method="fork", cpu=True)
    assert plan.describe() == "Launching 2 processes on CPU (gloo; fork)"
    plan = plan_of(num_processes=1, mixed_precision="bf16", start_method="spawn", cpu=True)
    assert plan.describe() == "Launching 1 process on CPU (gloo; spawn, bf16 mixed precision)"
    plan = plan_of(num_processes=2, mixed_precision="fp16", start_method="fork", cpu=True)
    assert plan.describe() == "Launching 2 processes on CPU (gloo; fork, fp16 mixed precision)"


def test_default_is_one_cpu_process_without_gpus() -> None:
    if cuda_facts.cuda_device_count():
        pytest.skip("GPUs present")
    assert plan_of(timeout=60, cpu=False).num_processes == 1


def test_nb_accel_use_cpu_puts_a_launch_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_facts, "cuda_device_count", lambda: 2)
    monkeypatch.setenv("NB_ACCEL_USE_CPU", "1")
    plan = plan_of()
    assert (plan.device_type, plan.backend, plan.num_processes) == ("cpu", "gloo", 1)
    explicit = plan_of(cpu=False)
    assert (explicit.device_type, explicit.num_processes) == ("cuda", 2)  # cpu=False wins
    monkeypatch.delenv("NB_ACCEL_USE_CPU")
    assert plan_of().device_type == "cuda"
