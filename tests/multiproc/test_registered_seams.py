"""A device type and a sharding strategy registered at run time, launched on by real workers:
the kernel's plan asks the device type how many devices it sees, the process group's backend,
the title and the ranks' variables; each rank asks it for its device, makes it current and
seeds it; the strategy chosen by name wraps what ``prepare`` is given."""

from __future__ import annotations

import os
from collections.abc import Iterator
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
    step that they were asked."""

    name: ClassVar[str] = "fakedev"
    label: ClassVar[str] = "fake device"
    distributed_type: ClassVar[DistributedType] = DistributedType.MULTI_CPU

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


@pytest.fixture
def fake_devices(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("NB_ACCEL_USE_CPU")  # the suite's: it would stand for cpu=True
    register_device_type(FakeDevices())
    yield
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
    fake_devices: None, capsys: pytest.CaptureFixture[str]
) -> None:
    found = notebook_launcher(what_the_rank_found, show_progress=False)  # one rank per device
    assert [rank["current"] for rank in found] == ["0 of 2", "1 of 2"]
    for rank in found:
        assert rank["device_type"] == "fakedev" and rank["distributed_type"] == "MULTI_CPU"
        assert (rank["launch"], rank["seed"], rank["backend"]) == ("1", "7", "gloo")
    assert "Launching 2 processes on 2 fake devices (gloo; fork)" in capsys.readouterr().out
    [on_cpu] = notebook_launcher(what_the_rank_found, num_processes=1, cpu=True)
    assert on_cpu["device_type"] == "cpu" and on_cpu["current"] is None


def test_more_ranks_than_registered_devices_are_refused(fake_devices: None) -> None:
    with pytest.raises(ValueError, match="num_processes=3 but only 2 fake devices are visible"):
        notebook_launcher(what_the_rank_found, num_processes=3, cpu=False)


class Tagged(DataParallelStrategy):
    """Data parallel that tags what it wraps: a strategy of the user's own, chosen in the workers
    through the variable its launches set."""

    name: ClassVar[str] = "tagged"
    label: ClassVar[str] = "Tagged DDP"

    @classmethod
    def worker_env(cls) -> dict[str, str]:
        return {**super().worker_env(), "TAGGED_SHARDING": "1"}

    @classmethod
    def from_options(cls, options: Any) -> Tagged | None:
        return cls() if os.environ.get("TAGGED_SHARDING") == "1" else None

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


def test_a_registered_strategy_is_chosen_by_name_for_a_launch(tagged: None) -> None:
    results = notebook_launcher(prepared_by, num_processes=2, sharding="tagged", cpu=True)
    assert results == [("tagged", "DistributedDataParallel", "tagged")] * 2
