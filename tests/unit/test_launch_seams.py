"""The front door's seams, checked without starting a process: one list of launch options, one
place that picks the launch backend (and a backend registered by a test is picked there), the
device types asked through their interface, and the strategies named rather than compared."""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from plans import spec_of

import nb_accel
from nb_accel.launch.backends import (
    backend_for,
    launch_backends,
    register_launch_backend,
    unregister_launch_backend,
)
from nb_accel.launch.launchers.backend import LaunchBackend
from nb_accel.launch.pool import WorkerPool
from nb_accel.launch.request import LaunchRequest, request_fields
from nb_accel.launch.single_node import SingleNodeLauncher
from nb_accel.launch.spec import LaunchSpec
from nb_accel.notebook.config_widget import ConfigWidget
from nb_accel.runtime.sharding import (
    register_sharding_strategy,
    strategy_class,
    unregister_sharding_strategy,
)
from nb_accel.runtime.sharding.ddp import DataParallelStrategy

pytestmark = pytest.mark.timeout(60)

PACKAGE = Path(nb_accel.__file__).parent


def test_notebook_launcher_hands_every_option_to_the_request() -> None:
    """The launcher's signature (Accelerate's plus ours) is the request's fields, in order: an
    option added to one and not the other fails here."""
    parameters = list(inspect.signature(nb_accel.notebook_launcher).parameters)
    options = [name for name in parameters if name not in ("function", "args", "kwargs")]
    assert tuple(options) == request_fields()


def test_the_pool_takes_the_launchers_options_by_the_same_names() -> None:
    pool = WorkerPool(2, cpu=True, mixed_precision="bf16", sharding="fsdp2", timeout=30)
    assert (pool.plan.mixed_precision, pool.plan.sharding, pool.plan.timeout_s) == (
        "bf16",
        "fsdp2",
        30.0,
    )
    assert pool.spec == spec_of(
        pool=True, num_processes=2, cpu=True, mixed_precision="bf16", sharding="fsdp2", timeout=30
    )


class _Recorded(LaunchBackend):
    """A backend that runs the function in this process once per rank, recording the spec it
    was given and what the launch asked of it."""

    name = "recorded"
    asked: ClassVar[list[str]] = []
    specs: ClassVar[list[LaunchSpec]] = []

    @classmethod
    def runs(cls, spec: LaunchSpec) -> bool:
        return spec.plan.num_processes == 3

    def start(self) -> None:
        self.asked.append("start")
        self.specs.append(self.spec)

    def wait(self) -> list[Any]:
        self.asked.append("wait")
        call = self._call
        return [(rank, call.function(*call.args)) for rank in range(self.spec.world_size)]

    def stop(self, graceful: bool = False) -> None:
        self.asked.append(f"stop graceful={graceful}")

    def make_payload(self, call: Any) -> Any:
        self._call = call
        return super().make_payload(call)


@pytest.fixture
def recorded() -> Iterator[type[_Recorded]]:
    _Recorded.asked, _Recorded.specs = [], []
    register_launch_backend(_Recorded)
    yield _Recorded
    unregister_launch_backend(_Recorded)


def _times_two(value: int) -> int:
    return value * 2


def test_a_registered_backend_runs_the_launches_it_takes(
    recorded: type[_Recorded], capsys: pytest.CaptureFixture[str]
) -> None:
    assert launch_backends()[0] is recorded  # asked before the built-in ones
    results = nb_accel.notebook_launcher(
        _times_two, args=(10,), num_processes=3, show_progress=False, mixed_precision="bf16"
    )
    assert results == [(0, 20), (1, 20), (2, 20)]
    assert recorded.asked == ["start", "wait", "stop graceful=True"]
    [spec] = recorded.specs
    assert (spec.plan.num_processes, spec.plan.mixed_precision) == (3, "bf16")
    assert (
        "Launching 3 processes on CPU (gloo; fork, bf16 mixed precision)" in capsys.readouterr().out
    )
    assert backend_for(spec_of(num_processes=2)) is SingleNodeLauncher  # the others, as before


#: A comparison with a device type's (or a process group backend's) name.
_DEVICE_COMPARISON = re.compile(
    r"""(==|!=|\bin|\bis)\s*\(?["'](cuda|cpu|nccl|gloo|xla|mps|xpu|npu)["']"""
    r"""|["'](cuda|cpu|nccl|gloo|xla|mps|xpu|npu)["']\s*(==|!=|in\b|not in)"""
)
#: Where device types are asked about by name: the device types, the device backends, XLA's.
_DEVICE_FOLDERS = ("runtime/device_types/", "runtime/device_backends/", "runtime/xla/")
#: Comparisons left elsewhere: questions about where one tensor is, and Accelerate's own
#: defaults keyed by backend name.
DEVICE_COMPARISONS_ELSEWHERE = 10


def _comparisons_outside_the_device_folders() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith(_DEVICE_FOLDERS):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if _DEVICE_COMPARISON.search(line.split("#", 1)[0]):
                found.append(f"{relative}:{number}: {line.strip()}")
    return found


def test_device_types_are_asked_not_compared_by_name() -> None:
    found = _comparisons_outside_the_device_folders()
    assert len(found) <= DEVICE_COMPARISONS_ELSEWHERE, "\n".join(found)
    assert not [line for line in found if "/launch/" in line or line.startswith("launch/")], found


#: Names of sharding strategies, as literals.
_STRATEGY_COMPARISON = re.compile(
    r"""(==|!=|\bin)\s*\(?["'](ddp|fsdp2?)["']|["'](ddp|fsdp2?)["']\s*(==|!=)"""
)


def test_strategies_are_compared_by_name_only_in_their_folder() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith("runtime/sharding/"):
            continue
        text = path.read_text()
        found += [f"{relative}: {m.group(0)}" for m in _STRATEGY_COMPARISON.finditer(text)]
    assert found == []


class _Marked(DataParallelStrategy):
    """Data parallel under a name of its own: a third strategy, registered at run time."""

    name: ClassVar[str] = "marked"
    label: ClassVar[str] = "Marked"

    @classmethod
    def launch_title(cls, shards: int) -> str | None:
        return f"marked, {shards} ranks"


@pytest.fixture
def marked() -> Iterator[type[_Marked]]:
    register_sharding_strategy(_Marked)
    yield _Marked
    unregister_sharding_strategy(_Marked.name)


def test_a_registered_strategy_is_chosen_by_name_everywhere(
    marked: type[_Marked], tmp_path: Path
) -> None:
    assert strategy_class("MARKED") is marked
    spec = spec_of(num_processes=2, cpu=True, sharding="marked")
    assert spec.plan.sharding == "marked"
    assert spec.title == "Launching 2 processes on CPU (gloo; fork, marked, 2 ranks)"
    assert WorkerPool(2, cpu=True, sharding="marked").plan.sharding == "marked"
    form = ConfigWidget(tmp_path / "c.yaml")
    assert ("MARKED", "marked") in list(form.controls["sharding"].options)
    form.controls["sharding"].value = "marked"
    form.save()
    assert spec_of(num_processes=2, cpu=True).plan.sharding == "ddp"  # another file is saved
    assert nb_accel.load_config(tmp_path / "c.yaml").sharding == "marked"
    with pytest.raises(ValueError, match="use one of 'ddp', 'fsdp2', 'marked'"):
        spec_of(num_processes=2, cpu=True, sharding="zero3")


def test_a_request_lists_what_was_given() -> None:
    request = LaunchRequest(num_processes=2, prefix_output=False)
    assert request.given() == {"num_processes": 2, "prefix_output": False}


def test_xla_is_found_through_the_entry_points_it_declares() -> None:
    """The registries load XLA's device type and device backend by the names the package
    metadata declares (``pyproject.toml``), importing nothing of it themselves."""
    from nb_accel.runtime.device_backends import choice
    from nb_accel.runtime.device_types import device_type
    from nb_accel.runtime.plugins import DEVICE_BACKENDS, DEVICE_TYPES, declared
    from nb_accel.runtime.xla.device_type import XlaDevices

    assert declared(DEVICE_TYPES)["xla"].value == "nb_accel.runtime.xla.device_type:XlaDevices"
    assert declared(DEVICE_BACKENDS)["xla"].value == "nb_accel.runtime.xla:xla_backend"
    assert type(device_type("xla")) is XlaDevices
    registry = Path(choice.__file__).read_text() + Path(inspect.getfile(device_type)).read_text()
    assert "runtime.xla" not in registry
