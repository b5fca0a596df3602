"""``torch_xla`` stays optional: nothing imports it unless a launch runs on XLA devices, and a
TPU runtime without it gets a clear error before anything starts."""

from __future__ import annotations

import importlib.abc
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import psutil
import pytest
import torch
import torch._dynamo  # an optimizer's first use loads it, which sets an env variable
from torch.utils.data import DataLoader, TensorDataset

from nb_accel import Accelerator, LaunchError, notebook_launcher
from nb_accel.runtime.xla.device_type import TPU_VARIABLES, xla_requested


class NoTorchXla(importlib.abc.MetaPathFinder):
    """Refuses, and records, every attempt to import ``torch_xla`` (installed or not)."""

    def __init__(self) -> None:
        self.attempts: list[str] = []

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> None:
        if fullname.split(".")[0] == "torch_xla":
            self.attempts.append(fullname)
            raise ImportError(f"{fullname} is blocked by the test")


@pytest.fixture
def blocker(monkeypatch: pytest.MonkeyPatch) -> Iterator[NoTorchXla]:
    """No TPU in the environment, and any import of torch_xla refused and recorded."""
    for name in ("PJRT_DEVICE", *TPU_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    for name in [m for m in sys.modules if m.split(".")[0] == "torch_xla"]:
        monkeypatch.delitem(sys.modules, name)
    finder = NoTorchXla()
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    yield finder


def test_importing_nb_accel_does_not_import_torch_xla() -> None:
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_xla_optional import NoTorchXla\n"
        "finder = NoTorchXla(); sys.meta_path.insert(0, finder)\n"
        "import nb_accel, nb_accel.utils, nb_accel.launch.launcher, nb_accel.runtime.accelerator\n"
        "print(finder.attempts, sorted(m for m in sys.modules if m.startswith('torch_xla')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[] []"


def _train_one_process(folder: Path) -> dict[str, Any]:
    """The single-process code paths that have an XLA branch: prepare, the training step,
    clipping, collectives, the loader, checkpoints."""
    accelerator = Accelerator(gradient_accumulation_steps=2)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    data = TensorDataset(torch.randn(8, 3), torch.randn(8, 1))
    loader = DataLoader(data, batch_size=2, shuffle=True)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    for x, y in accelerator.skip_first_batches(loader, 1):
        with accelerator.accumulate(model):
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            accelerator.clip_grad_value_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        accelerator.gather_for_metrics(y)
    row = torch.ones(2, 1)
    accelerator.gather(row), accelerator.reduce(row), accelerator.broadcast(row)
    accelerator.pad_across_processes(row), accelerator.gather_object([1])
    accelerator.wait_for_everyone()
    accelerator.set_trigger()
    accelerator.check_trigger()
    accelerator.save_state(folder / "state")
    accelerator.load_state(folder / "state")
    accelerator.save_model(model, folder / "model")
    accelerator.save({"w": row}, folder / "w.pt")
    return {"type": accelerator.distributed_type.value, "device": accelerator.device.type}


def test_cpu_training_paths_do_not_import_torch_xla(blocker: NoTorchXla, tmp_path: Path) -> None:
    assert _train_one_process(tmp_path) == {"type": "NO", "device": "cpu"}
    assert blocker.attempts == []


def _launched_attempts(folder: Path) -> list[str]:
    finder = next(f for f in sys.meta_path if isinstance(f, NoTorchXla))
    _train_one_process(folder)
    return [*finder.attempts, *(m for m in sys.modules if m.startswith("torch_xla"))]


def test_a_cpu_launch_does_not_import_torch_xla(blocker: NoTorchXla, tmp_path: Path) -> None:
    results = notebook_launcher(
        _launched_attempts, args=(tmp_path,), num_processes=1, show_progress=False
    )
    assert results == [[]]  # the forked worker kept the blocker: it saw no attempt
    assert blocker.attempts == []


@pytest.mark.parametrize(
    ("name", "value"),
    [("PJRT_DEVICE", "TPU"), ("PJRT_DEVICE", "CPU")] + [(name, "tpu-0") for name in TPU_VARIABLES],
)
def test_a_tpu_runtime_is_recognised(
    name: str, value: str, blocker: NoTorchXla, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert not xla_requested()
    monkeypatch.setenv(name, value)
    assert xla_requested()
    monkeypatch.setenv(name, "")
    assert not xla_requested()  # empty counts as unset
    assert blocker.attempts == []


def test_tpu_runtime_without_torch_xla_fails_before_starting(
    blocker: NoTorchXla, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    monkeypatch.delenv("NB_ACCEL_USE_CPU")  # the suite's: it would stand for cpu=True
    with pytest.raises(LaunchError, match=r'pip install "nb-accel\[xla\]"') as caught:
        notebook_launcher(_launched_attempts, args=(Path("unused"),))
    assert "PJRT_DEVICE=TPU" in str(caught.value)
    assert "Launching" not in capsys.readouterr().out
    assert psutil.Process().children(recursive=True) == []
    assert blocker.attempts  # it did try, and said what to do


def test_cpu_true_on_a_tpu_runtime_launches_on_the_cpu(
    blocker: NoTorchXla, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TPU_NAME", "local")
    results = notebook_launcher(
        _launched_attempts, args=(tmp_path,), num_processes=1, cpu=True, show_progress=False
    )
    assert results == [[]]
    assert blocker.attempts == []


def test_a_torch_xla_of_another_release_is_refused_before_anything_starts(
    blocker: NoTorchXla, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = ModuleType("torch_xla")
    fake.__version__ = "2.9.0+git1a2b3c"  # type: ignore[attr-defined]
    spawner = ModuleType("torch_xla.distributed.xla_multiprocessing")
    for name, module in {
        "torch_xla": fake,
        "torch_xla.distributed": ModuleType("torch_xla.distributed"),
        "torch_xla.distributed.xla_multiprocessing": spawner,
    }.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    monkeypatch.delenv("NB_ACCEL_USE_CPU")  # the suite's: it would stand for cpu=True
    with pytest.raises(LaunchError) as info:
        notebook_launcher(lambda: 1, num_processes=1)
    message = str(info.value)
    assert "torch_xla 2.9.0+git1a2b3c is built for torch 2.9" in message
    assert f"torch_xla=={'.'.join(torch.__version__.split('.')[:2])}.*" in message
    assert psutil.Process().children(recursive=True) == []
