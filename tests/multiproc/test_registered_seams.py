"""A device type and a sharding strategy registered at run time, launched on by real workers:
the kernel's plan asks the device type how many devices it sees, the process group's backend,
the title and the ranks' variables; each rank asks it for its device, makes it current and
seeds it, and a training run on it (``prepare``, ``backward``, the loader's generator
synchronisation, ``save_state``/``load_state``) takes and gives its generator's states through
it; the strategy chosen by name wraps what ``prepare`` is given."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from nb_accel import Accelerator, AcceleratorState, PartialState, notebook_launcher, set_seed
from nb_accel.runtime.device_types import (
    DeviceType,
    register_device_type,
    unregister_device_type,
)
from nb_accel.runtime.enums import DistributedType
from nb_accel.runtime.sharding import (
    ModelSetup,
    register_sharding_strategy,
    unregister_sharding_strategy,
)
from nb_accel.runtime.sharding.ddp import DataParallelStrategy

pytestmark = pytest.mark.timeout(120)


class FakeDevices(DeviceType):
    """Two "devices" that are the CPU underneath (collectives through gloo), which say at each
    step that they were asked; their own generator is a CPU one, and each rank writes what it
    was asked of it to a file of its own in ``calls``."""

    name: ClassVar[str] = "fakedev"
    label: ClassVar[str] = "fake device"
    distributed_type: ClassVar[DistributedType] = DistributedType.MULTI_CPU

    def __init__(self, calls: Path) -> None:
        self.calls = calls
        self.generator = torch.Generator()

    def _called(self, what: str) -> None:
        with open(self.calls / f"rank-{os.environ.get('RANK', 'none')}.txt", "a") as file:
            file.write(what + "\n")

    def visible_count(self) -> int:
        return 2

    def group_backend(self, cpu_collectives: bool) -> str:
        return "gloo"

    def worker_env(self) -> dict[str, str]:
        return {"FAKE_DEVICE_LAUNCH": "1"}

    def rank_device(self, local_rank: int) -> torch.device:
        return torch.device("cpu")

    def use_rank_device(self, local_rank: int, local_world_size: int) -> None:
        os.environ["FAKE_DEVICE_CURRENT"] = f"{local_rank} of {local_world_size}"

    def seed(self, seed: int) -> None:
        os.environ["FAKE_DEVICE_SEED"] = str(seed)
        self.generator.manual_seed(seed)
        self._called("seed")

    def rng_state(self) -> torch.Tensor | None:
        self._called("rng_state")
        return self.generator.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        self._called("set_rng_state")
        self.generator.set_state(state)

    def saved_rng_states(self) -> list[torch.Tensor] | None:
        self._called("saved_rng_states")
        return [self.generator.get_state()]

    def restore_rng_states(self, states: list[torch.Tensor]) -> None:
        self._called("restore_rng_states")
        [state] = states
        self.generator.set_state(state)

    def collective_device(self, backend: str | None, device: torch.device) -> torch.device:
        self._called("collective_device")
        return super().collective_device(backend, device)


@pytest.fixture
def fake_devices(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    monkeypatch.delenv("NB_ACCEL_USE_CPU")  # the suite's: it would stand for cpu=True
    calls = tmp_path / "calls"
    calls.mkdir()
    register_device_type(FakeDevices(calls))
    yield calls
    unregister_device_type(FakeDevices.name)


def what_the_rank_found() -> dict[str, Any]:
    state = PartialState()
    set_seed(7)
    return {
        "device_type": state.device_type.name,
        "distributed_type": state.distributed_type.value,
        "launch": os.environ.get("FAKE_DEVICE_LAUNCH"),
        "current": os.environ.get("FAKE_DEVICE_CURRENT"),
        "seed": os.environ.get("FAKE_DEVICE_SEED"),
        "backend": torch.distributed.get_backend(),
    }


def test_a_registered_device_type_is_launched_on(
    fake_devices: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    found = notebook_launcher(what_the_rank_found, show_progress=False)  # one rank per device
    assert [rank["current"] for rank in found] == ["0 of 2", "1 of 2"]
    for rank in found:
        assert rank["device_type"] == "fakedev" and rank["distributed_type"] == "MULTI_CPU"
        assert (rank["launch"], rank["seed"], rank["backend"]) == ("1", "7", "gloo")
    assert "Launching 2 processes on 2 fake devices (gloo; fork)" in capsys.readouterr().out
    [on_cpu] = notebook_launcher(what_the_rank_found, num_processes=1, cpu=True)
    assert on_cpu["device_type"] == "cpu" and on_cpu["current"] is None


def test_more_ranks_than_registered_devices_are_refused(fake_devices: Path) -> None:
    with pytest.raises(ValueError, match="num_processes=3 but only 2 fake devices are visible"):
        notebook_launcher(what_the_rank_found, num_processes=3, cpu=False)


def train_and_checkpoint(folder: str) -> dict[str, Any]:
    """Train a step per batch on the fake devices, their generator synchronised by the loader,
    then save, draw on, load and draw again."""
    accelerator = Accelerator(rng_types=["generator", "cuda"])  # "cuda": the device's own
    devices = PartialState().device_type
    assert isinstance(devices, FakeDevices)
    set_seed(3, device_specific=True)  # each rank's device generator starts elsewhere
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=2, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    steps = 0
    for inputs, targets in loader:  # its first step gives every rank rank 0's device state
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        steps += 1
    synchronised = torch.rand(1, generator=devices.generator).item()
    accelerator.save_state(folder)
    expected = torch.rand(1, generator=devices.generator).item()
    torch.rand(5, generator=devices.generator)  # the run goes on
    accelerator.load_state(folder)
    restored = torch.rand(1, generator=devices.generator).item()
    return {"steps": steps, "synchronised": synchronised, "next": (expected, restored)}


def test_a_registered_device_type_trains_synchronises_and_checkpoints(
    fake_devices: Path, tmp_path: Path
) -> None:
    """The device type's generator is synchronised by the loader (through the device it names
    for collectives), saved in the checkpoint under its name and restored from it."""
    folder = tmp_path / "checkpoint"
    results = notebook_launcher(
        train_and_checkpoint, args=(str(folder),), num_processes=2, show_progress=False
    )
    assert [r["steps"] for r in results] == [2, 2]
    assert results[0]["synchronised"] == results[1]["synchronised"]
    for result in results:
        expected, restored = result["next"]
        assert restored == expected
    for rank in (0, 1):
        saved = torch.load(folder / f"random_states_{rank}.pkl", weights_only=True)
        assert len(saved["rng"][FakeDevices.name]) == 1
        asked = set((fake_devices / f"rank-{rank}.txt").read_text().split())
        assert asked >= {
            "seed",
            "rng_state",
            "set_rng_state",
            "collective_device",
            "saved_rng_states",
            "restore_rng_states",
        }, asked


class Tagged(DataParallelStrategy):
    """Data parallel that tags what it wraps: a strategy of the user's own, chosen in the workers
    by the name the launch gives, with no variable of its own."""

    name: ClassVar[str] = "tagged"
    label: ClassVar[str] = "Tagged DDP"

    def wrap_model(self, model: torch.nn.Module, setup: ModelSetup) -> torch.nn.Module:
        wrapped = super().wrap_model(model, setup)
        wrapped.tagged_by = self.name  # type: ignore[assignment]
        return wrapped


@pytest.fixture
def tagged() -> Iterator[None]:
    register_sharding_strategy(Tagged)
    yield
    unregister_sharding_strategy(Tagged.name)


def prepared_by() -> tuple[str, str, str]:
    accelerator = Accelerator()
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    return AcceleratorState().sharding.name, type(model).__name__, model.tagged_by


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_registered_strategy_is_chosen_by_name_for_a_launch(
    tagged: None, start_method: str
) -> None:
    """Forked ranks inherit the registration; spawned ones import the strategy from where the
    kernel's launch says it lives."""
    results = notebook_launcher(
        prepared_by, num_processes=2, sharding="tagged", cpu=True, start_method=start_method
    )
    assert results == [("tagged", "DistributedDataParallel", "tagged")] * 2
