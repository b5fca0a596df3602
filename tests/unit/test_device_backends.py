"""The device backend seam: a worker's state is served by the backend its environment names,
built once, and the collectives, the barrier and device seeding go through it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import pytest
import torch

from nb_accel import PartialState, set_seed
from nb_accel.runtime.collectives import ops
from nb_accel.runtime.device_backends import choice
from nb_accel.runtime.device_backends.base import DeviceBackend, Rank
from nb_accel.runtime.device_backends.torch_distributed import TorchDistributedBackend
from nb_accel.runtime.device_types import device_type
from nb_accel.runtime.enums import DistributedType
from nb_accel.runtime.state import reset_all_states


class RecordingBackend(DeviceBackend):
    """Two ranks on the CPU that record what they are asked and answer with marked values."""

    title = "recording"
    built: ClassVar[list[RecordingBackend]] = []

    def __init__(self, rank: Rank) -> None:
        super().__init__(rank)
        self.calls: list[tuple[str, Any]] = []
        RecordingBackend.built.append(self)

    def rank_fields(self, cpu: bool, options: dict[str, Any]) -> dict[str, Any]:
        return {
            "backend": "recording",
            "num_processes": 2,
            "process_index": 1,
            "local_process_index": 1,
            "num_local_processes": 2,
            "device": torch.device("cpu"),
            "device_type": device_type("cpu"),
            "distributed_type": DistributedType.MULTI_CPU,
        }

    def _record(self, name: str, value: Any) -> Any:
        self.calls.append((name, value))
        return (name, value)

    def barrier(self) -> None:
        self._record("barrier", None)

    @property
    def collectives_active(self) -> bool:
        return True

    def gather(self, tree: Any) -> Any:
        return self._record("gather", tree)

    def gather_object(self, obj: Any) -> Any:
        return self._record("gather_object", obj)

    def gather_object_among(self, obj: Any, members: list[int]) -> list[Any]:
        return [self._record("gather_object_among", (obj, members))]

    def reduce(self, tree: Any, reduction: str, scale: float) -> Any:
        return self._record("reduce", (reduction, scale))

    def broadcast(self, tree: Any, from_process: int) -> Any:
        return self._record("broadcast", from_process)

    def broadcast_object_list(self, object_list: list[Any], from_process: int) -> list[Any]:
        return [self._record("broadcast_object_list", from_process)]

    def largest_sizes(self, sizes: torch.Tensor) -> list[int]:
        self._record("largest_sizes", sizes.tolist())
        return [4 for _ in sizes.tolist()]

    def seed_device(self, seed: int) -> None:
        self._record("seed_device", seed)


@pytest.fixture
def recording(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], RecordingBackend]]:
    """The recording backend registered and named by the environment; states start afresh."""
    monkeypatch.setitem(choice.DEVICE_BACKEND_REGISTRY, "recording", RecordingBackend)
    monkeypatch.setenv(choice.BACKEND_VARIABLE, "recording")
    RecordingBackend.built.clear()
    reset_all_states()
    yield lambda: RecordingBackend.built[-1]
    reset_all_states()


def test_the_state_takes_its_fields_from_the_backend_built_once(
    recording: Callable[[], RecordingBackend],
) -> None:
    state = PartialState()
    assert (state.num_processes, state.process_index, state.backend) == (2, 1, "recording")
    assert state.distributed_type == DistributedType.MULTI_CPU
    assert PartialState().device_backend is state.device_backend is recording()
    assert len(RecordingBackend.built) == 1


def test_collectives_barrier_and_seeding_ask_the_backend(
    recording: Callable[[], RecordingBackend],
) -> None:
    tensor = torch.arange(3)
    assert ops.gather(tensor)[0] == "gather"
    assert ops.gather_object("x") == ("gather_object", "x")
    assert ops.gather_object_among("x", [1, 0]) == [("gather_object_among", ("x", [0, 1]))]
    assert ops.reduce(tensor, "sum", 2.0) == ("reduce", ("sum", 2.0))
    assert ops.broadcast(tensor, 1) == ("broadcast", 1)
    assert ops.broadcast_object_list([None], 1) == [("broadcast_object_list", 1)]
    padded = ops.pad_across_processes({"a": torch.ones(2, 3)}, dim=0)
    assert padded["a"].shape == (4, 3)
    PartialState().wait_for_everyone()
    set_seed(7)
    names = [name for name, _ in recording().calls]
    assert names == [
        "gather",
        "gather_object",
        "gather_object_among",
        "reduce",
        "broadcast",
        "broadcast_object_list",
        "largest_sizes",
        "barrier",
        "seed_device",
    ]
    with pytest.raises(ValueError, match="reduction"):
        ops.reduce(tensor, "product")
    assert ops.gather_object_among("x", [1]) == ["x"]  # this rank alone: nothing asked
    assert len(recording().calls) == len(names)


def test_without_a_registered_name_torch_distributed_serves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(choice.BACKEND_VARIABLE, "gloo")  # a process group's backend
    reset_all_states()
    state = PartialState()
    assert isinstance(state.device_backend, TorchDistributedBackend)
    assert choice.named_device_backend() is None
    assert state.distributed_type == DistributedType.NO
    assert ops.gather(torch.arange(2)).tolist() == [0, 1]


def test_a_worker_naming_xla_finds_its_backend_without_loading_torch_xla() -> None:
    """``NB_ACCEL_BACKEND=xla`` finds the XLA backend even before anything loaded its package
    (the package registers it when loaded by name), and torch_xla stays unloaded until a
    state builds the backend."""
    code = (
        "import os, sys\n"
        "os.environ['NB_ACCEL_BACKEND'] = 'xla'\n"
        "from nb_accel.runtime.device_backends import choice\n"
        "loaded = 'nb_accel.runtime.xla' in sys.modules\n"
        "print(loaded, choice.named_device_backend(), "
        "[m for m in sys.modules if m.startswith('torch_xla')])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "False xla []"
