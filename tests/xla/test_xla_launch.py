"""Launching through ``xmp.spawn``: results, the worker's state, errors, bad options."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch_xla")

import torch
import torch_xla

from nb_accel import Accelerator, DistributedType, notebook_launcher
from nb_accel.errors import RemoteTraceback


class BadBatchError(ValueError):
    """An exception class of the test's own, to check the type survives the trip."""


def describe(scale: float) -> dict[str, Any]:
    accelerator = Accelerator()
    return {
        "type": accelerator.distributed_type,
        "device": str(accelerator.device),
        "rank": accelerator.process_index,
        "world": accelerator.num_processes,
        "pid": os.getpid(),
        "tensor": torch.ones(2, device=accelerator.device) * scale,
    }


def fail(message: str) -> None:
    accelerator = Accelerator()
    print(f"rank {accelerator.process_index} is about to fail")
    raise BadBatchError(message)


@pytest.mark.parametrize("num_processes", [None, 1])
def test_launch_returns_every_rank_result_on_the_xla_device(num_processes: int | None) -> None:
    results = notebook_launcher(describe, args=(3.0,), num_processes=num_processes)
    assert len(results) == 1
    result = results[0]
    assert result["type"] == DistributedType.XLA
    assert result["device"].startswith("xla")
    assert (result["rank"], result["world"]) == (0, 1)
    assert result["pid"] != os.getpid()  # never in the kernel itself
    assert result["tensor"].device.type == "cpu"
    assert torch.equal(result["tensor"], torch.full((2,), 3.0))


def test_the_kernel_never_uses_the_xla_device() -> None:
    notebook_launcher(describe, args=(1.0,), num_processes=1)
    assert not torch_xla._XLAC._xla_runtime_is_initialized()


def test_worker_exception_is_reraised_with_its_type_and_rank(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(BadBatchError, match="batch 3 is empty") as caught:
        notebook_launcher(fail, args=("batch 3 is empty",), show_progress=False)
    assert isinstance(caught.value.__cause__, RemoteTraceback)
    assert "fail" in str(caught.value.__cause__)
    assert any("rank 0" in note for note in getattr(caught.value, "__notes__", []))
    assert "rank 0 is about to fail" in capsys.readouterr().out


def test_a_launch_after_a_failure_works() -> None:
    with pytest.raises(BadBatchError):
        notebook_launcher(fail, args=("first",), show_progress=False)
    assert notebook_launcher(describe, args=(2.0,), show_progress=False)[0]["rank"] == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"mixed_precision": "fp16"}, "not available on XLA"),
        ({"start_method": "spawn"}, "start with 'fork' only"),
        ({"num_processes": 3}, "offers one XLA device"),
    ],
)
def test_options_an_xla_launch_cannot_honour_fail_before_starting(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        notebook_launcher(describe, args=(1.0,), **options)


def test_cpu_true_launches_on_the_cpu_instead() -> None:
    result = notebook_launcher(describe, args=(1.0,), num_processes=1, cpu=True)[0]
    assert result["type"] == DistributedType.NO
    assert result["device"] == "cpu"


def wait_forever(flag: str) -> None:
    Path(flag).write_text(str(os.getpid()))
    time.sleep(600)


def _interrupt_once_started(flag: Path) -> None:
    deadline = time.monotonic() + 60
    while not flag.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.parametrize("num_processes", [None, 1])
def test_interrupting_the_kernel_stops_every_worker(
    num_processes: int | None, tmp_path: Path
) -> None:
    flag = tmp_path / "started"
    interrupter = threading.Thread(target=_interrupt_once_started, args=(flag,))
    interrupter.start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        notebook_launcher(
            wait_forever, args=(str(flag),), num_processes=num_processes, show_progress=False
        )
    interrupter.join()
    assert time.monotonic() - started < 30
    worker = int(flag.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(worker, 0)  # gone, and reaped
