"""One registry shape for every kind of plug-in (``nb_accel/_registry.py``): the generic
:class:`Registry` itself, then each of the six kinds (launch backends, device types, device
backends, sharding strategies, trackers, launch views) with a dummy registered, chosen or listed
first, unregistered and gone; and the kernel's registrations named in a launch's environment for
workers that do not inherit them."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, cast

import pytest
import torch
from plans import plan_of, spec_of

from nb_accel._registry import (
    REGISTERED_VARIABLE,
    Registry,
    UnknownNameError,
    dotted_name,
    registered_env,
)
from nb_accel.config import Config, ConfigError
from nb_accel.launch.backends import (
    backend_for,
    launch_backends,
    register_launch_backend,
    unregister_launch_backend,
)
from nb_accel.launch.launchers.backend import LaunchBackend
from nb_accel.launch.launchers.view import make_view
from nb_accel.launch.single_node import SingleNodeLauncher
from nb_accel.launch.spec import LaunchSpec
from nb_accel.launch.views.view import (
    NullView,
    register_view_factory,
    unregister_view_factory,
    view_factory,
)
from nb_accel.launch.workers import worker_env
from nb_accel.runtime.device_backends import choice
from nb_accel.runtime.device_backends.base import Rank
from nb_accel.runtime.device_types import (
    DeviceType,
    choose_device_type,
    device_type,
    device_types,
    register_device_type,
    unregister_device_type,
)
from nb_accel.runtime.enums import DistributedType
from nb_accel.runtime.sharding import (
    SHARDING_VARIABLE,
    STRATEGIES,
    choose_strategy,
    register_sharding_strategy,
    strategy_class,
    unregister_sharding_strategy,
)
from nb_accel.runtime.sharding.ddp import DataParallelStrategy
from nb_accel.runtime.tracking.base import GeneralTracker
from nb_accel.runtime.tracking.registry import (
    LOGGER_TYPE_TO_CLASS,
    filter_trackers,
    register_tracker_class,
)

pytestmark = pytest.mark.timeout(60)


# --- the generic registry ------------------------------------------------------------------


def test_registered_items_come_newest_first_then_the_built_in_ones() -> None:
    registry: Registry[int] = Registry("number", built_in={"one": 1, "two": 2})
    assert registry.names() == ["one", "two"] and list(registry.values()) == [1, 2]
    registry.register("ten", 10)
    registry.register("two", 20)  # in front of the built-in "two", which it hides
    assert list(registry.items()) == [("two", 20), ("ten", 10), ("one", 1)]
    registry.register("ten", 11)  # registered again: newest again
    assert registry.names() == ["ten", "two", "one"] and registry.registered() == {
        "ten": 11,
        "two": 20,
    }
    registry.unregister("two")  # the built-in one is back
    registry.unregister("one")  # a built-in one is not forgotten
    registry.unregister("nothing")
    assert list(registry.items()) == [("ten", 11), ("one", 1), ("two", 2)]
    assert registry.built_in() == ["one", "two"]


def test_an_unknown_name_is_refused_naming_the_known_ones() -> None:
    registry: Registry[int] = Registry("number", built_in={"one": 1})
    registry.register("ten", 10)
    with pytest.raises(ValueError, match=r"no number is named 'six'; the numbers are 'ten', 'one'"):
        registry["six"]
    with pytest.raises(KeyError) as raised:  # a mapping's error too
        registry["six"]
    assert isinstance(raised.value, UnknownNameError)
    assert str(raised.value).startswith("no number")  # not a KeyError's quoted repr
    assert registry.get("six") is None and registry.get("six", 0) == 0
    assert "six" not in registry and 6 not in registry and "ten" in registry


def test_it_reads_and_writes_as_a_mapping() -> None:
    registry: Registry[str] = Registry("word", plural="words of ours")
    registry["a"] = "alpha"
    assert dict(registry) == {"a": "alpha"} and len(registry) == 1
    del registry["a"]
    assert len(registry) == 0
    with pytest.raises(KeyError):
        del registry["a"]  # nothing registered under it
    with pytest.raises(ValueError, match=r"the words of ours are $"):
        registry["a"]
    assert registry != Registry("word") and registry == registry  # compared as itself


def test_built_in_strings_are_imported_only_when_asked_and_loaded_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "nb_accel_lazy_things.py").write_text("class Thing:\n    size = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "nb_accel_lazy_things", raising=False)
    loads: list[str] = []

    def made(name: str, found: object) -> Any:
        loads.append(name)
        return cast(Any, found)()

    registry: Registry[Any] = Registry(
        "thing", built_in={"t": "nb_accel_lazy_things:Thing"}, load=made
    )
    assert "t" in registry and registry.names() == ["t"]
    assert "nb_accel_lazy_things" not in sys.modules  # named, not imported
    assert registry["t"].size == 3 and registry["t"] is registry["t"]
    assert loads == ["t"] and "nb_accel_lazy_things" in sys.modules
    registered = object()
    registry.register("t", registered)  # a registered item is taken as it is
    assert registry["t"] is registered and loads == ["t"]


def test_declared_entry_points_come_between_registered_and_built_in_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An installed package's entry point of the registry's group (a distribution's metadata
    made in ``tmp_path``), loaded by name, through the registry's ``load``."""
    info = tmp_path / "nb_accel_plugin_dummy-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nb-accel-plugin-dummy\n")
    (info / "entry_points.txt").write_text(
        "[nb_accel_test.registry_numbers]\ndeclared = nb_accel_plugin_dummy:VALUE\n"
    )
    (tmp_path / "nb_accel_plugin_dummy.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "nb_accel_plugin_dummy", raising=False)
    registry: Registry[int] = Registry(
        "number",
        built_in={"one": 1},
        group="nb_accel_test.registry_numbers",
        load=lambda name, found: cast(int, found) * 10,
    )
    registry.register("ten", 10)
    assert registry.names() == ["ten", "declared", "one"]
    assert "nb_accel_plugin_dummy" not in sys.modules
    assert registry["declared"] == 70 and registry["one"] == 10  # load: every unregistered one


class Importable:
    """A class another process can import from this module."""


def test_only_what_another_process_can_import_is_named_for_it() -> None:
    assert dotted_name(Importable) == f"{__name__}:Importable"
    assert dotted_name(Importable()) == f"{__name__}:Importable"  # an instance: its class
    assert dotted_name(test_only_what_another_process_can_import_is_named_for_it) is not None

    class Local:
        pass

    assert dotted_name(Local) is None and dotted_name(lambda: 1) is None
    registry: Registry[object] = Registry("thing")
    registry.register("local", Local)
    registry.register("mine", Importable)
    assert registry.exported() == {"mine": f"{__name__}:Importable"}


def test_a_worker_finds_what_the_kernel_registered_in_its_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kernel: Registry[object] = Registry("thing", group="nb_accel_test.things", in_workers=True)
    kernel.register("mine", Importable)
    env = registered_env()
    assert REGISTERED_VARIABLE in env and f"{__name__}:Importable" in env[REGISTERED_VARIABLE]
    kernel.unregister("mine")  # as in a worker that did not inherit the registration
    assert "mine" not in kernel
    monkeypatch.setenv(REGISTERED_VARIABLE, env[REGISTERED_VARIABLE])
    assert kernel.names() == ["mine"] and kernel["mine"] is Importable
    monkeypatch.setenv(
        REGISTERED_VARIABLE, '{"nb_accel_test.things": {"gone": "nowhere_at_all:X"}}'
    )
    with pytest.raises(ImportError, match="the kernel registered the thing 'gone' as nowhere"):
        kernel["gone"]


# --- the six kinds -------------------------------------------------------------------------


class DummyBackend(LaunchBackend):
    """A launch backend that takes launches of five processes (and runs nothing)."""

    name: ClassVar[str] = "dummy"

    @classmethod
    def runs(cls, spec: LaunchSpec) -> bool:
        return spec.plan.num_processes == 5

    def start(self) -> None:
        raise AssertionError("not started in these tests")

    def wait(self) -> list[Any]:
        raise AssertionError("not started in these tests")

    def stop(self, graceful: bool = False) -> None:
        del graceful


def test_a_launch_backend_is_registered_chosen_and_unregistered() -> None:
    spec = spec_of(num_processes=5, cpu=True)
    assert backend_for(spec) is SingleNodeLauncher
    register_launch_backend(DummyBackend)
    try:
        assert launch_backends()[0] is DummyBackend
        assert backend_for(spec) is DummyBackend
        assert backend_for(spec_of(num_processes=2, cpu=True)) is SingleNodeLauncher
    finally:
        unregister_launch_backend(DummyBackend)
    assert DummyBackend not in launch_backends() and backend_for(spec) is SingleNodeLauncher
    with pytest.raises(TypeError, match="is not a LaunchBackend subclass"):
        register_launch_backend(cast(Any, object()))


class DummyDevices(DeviceType):
    """Three devices that are the CPU underneath."""

    name: ClassVar[str] = "dummydev"
    label: ClassVar[str] = "dummy device"
    distributed_type: ClassVar[DistributedType] = DistributedType.MULTI_CPU

    def visible_count(self) -> int:
        return 3

    def group_backend(self, cpu_collectives: bool) -> str:
        return "gloo"

    def rank_device(self, local_rank: int) -> torch.device:
        return torch.device("cpu")


def test_a_device_type_is_registered_chosen_and_unregistered() -> None:
    dummy = DummyDevices()
    register_device_type(dummy)
    try:
        assert device_types()[0] is dummy and device_type("dummydev") is dummy
        assert choose_device_type(cpu=False, environ={}) is dummy  # the first with devices
        assert choose_device_type(cpu=True, environ={}).name == "cpu"
    finally:
        unregister_device_type("dummydev")
    assert all(found.name != "dummydev" for found in device_types())
    with pytest.raises(ValueError, match="no device type is named 'dummydev'; the device types"):
        device_type("dummydev")


class DummyDeviceBackend:
    """Stands for a device backend: it records the state it serves."""

    def __init__(self, rank: Rank) -> None:
        self.rank = rank


def test_a_device_backend_is_registered_chosen_and_unregistered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(choice.BACKEND_VARIABLE, "dummy")
    assert choice.named_device_backend() is None
    state = cast(Rank, object())
    choice.register_device_backend("dummy", cast(Any, DummyDeviceBackend))
    try:
        assert choice.DEVICE_BACKEND_REGISTRY.names()[0] == "dummy"
        assert choice.named_device_backend() == "dummy"
        made = cast(Any, choice.choose(state))
        assert isinstance(made, DummyDeviceBackend) and made.rank is state
    finally:
        choice.unregister_device_backend("dummy")
    assert choice.named_device_backend() is None and "dummy" not in choice.DEVICE_BACKEND_REGISTRY


class DummyStrategy(DataParallelStrategy):
    """Data parallel under a name of its own, with nothing else of its own: chosen by name."""

    name: ClassVar[str] = "dummyshard"
    label: ClassVar[str] = "Dummy"


@pytest.fixture
def no_named_strategy(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(SHARDING_VARIABLE, raising=False)
    yield


def test_a_sharding_strategy_is_registered_chosen_by_name_and_unregistered(
    no_named_strategy: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    register_sharding_strategy(DummyStrategy)
    try:
        assert (
            STRATEGIES.names()[0] == "dummyshard" and strategy_class("DummyShard") is DummyStrategy
        )
        assert Config(sharding="dummyshard").sharding == "dummyshard"
        plan = plan_of(num_processes=2, start_method="fork", cpu=True, sharding="dummyshard")
        env = worker_env(plan)
        assert env[SHARDING_VARIABLE] == "dummyshard"
        assert f"{__name__}:DummyStrategy" in env[REGISTERED_VARIABLE]  # for spawned ranks
        assert choose_strategy({}).name == "ddp"  # registered, but no launch names it
        monkeypatch.setenv(SHARDING_VARIABLE, "dummyshard")  # a rank of a launch that does
        assert type(choose_strategy({})) is DummyStrategy
        monkeypatch.setenv(SHARDING_VARIABLE, "ddp")
        assert choose_strategy({}).name == "ddp"
    finally:
        unregister_sharding_strategy("dummyshard")
    assert "dummyshard" not in STRATEGIES
    with pytest.raises(ConfigError):
        Config(sharding="dummyshard")
    with pytest.raises(ValueError, match="use one of 'ddp', 'fsdp2'"):
        strategy_class("dummyshard")
    monkeypatch.setenv(SHARDING_VARIABLE, "dummyshard")  # named, but this rank cannot find it
    with pytest.raises(ValueError, match="no sharding strategy is named 'dummyshard'"):
        choose_strategy({})


class DummyTracker(GeneralTracker):
    """A tracker that records nothing."""

    name = "dummytracker"
    requires_logging_directory = False

    def __init__(self, project: str, **options: Any) -> None:
        super().__init__()
        del project, options

    @property
    def tracker(self) -> None:
        return None


def test_a_tracker_is_registered_chosen_and_unregistered() -> None:
    register_tracker_class(DummyTracker)
    try:
        assert LOGGER_TYPE_TO_CLASS.names()[0] == "dummytracker"
        assert LOGGER_TYPE_TO_CLASS["dummytracker"] is DummyTracker
        assert filter_trackers("dummytracker") == ["dummytracker"]
    finally:
        del LOGGER_TYPE_TO_CLASS["dummytracker"]
    assert "dummytracker" not in LOGGER_TYPE_TO_CLASS
    with pytest.raises(ValueError, match="is no tracker nb_accel knows"):
        filter_trackers("dummytracker")


class DummyView(NullView):
    """A view that shows nothing: what the dummy factory makes."""


def test_a_view_factory_is_registered_chosen_and_unregistered(
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = view_factory()
    made = DummyView()

    def factory(*args: Any, **kwargs: Any) -> DummyView:
        return made

    register_view_factory(factory, name="dummy")
    try:
        assert view_factory() is factory
        assert make_view("title", 2, show_progress=True, all_ranks_metrics=False) is made
    finally:
        unregister_view_factory("dummy")
    assert view_factory() is before
    assert make_view("title", 2, show_progress=True, all_ranks_metrics=False) is not made
    capsys.readouterr()  # the text view's title


def test_a_device_type_registered_in_the_kernel_is_found_in_a_spawned_process() -> None:
    """A process that does not inherit the registration (a spawned rank) finds the device type
    by the name its launch gives, from the environment the launch sets."""
    register_device_type(DummyDevices())
    try:
        env = {**os.environ, **registered_env(), "NB_ACCEL_DEVICE_TYPE": "dummydev"}
    finally:
        unregister_device_type("dummydev")
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    code = (
        "from nb_accel.runtime.device_types import rank_device_type\n"
        "found = rank_device_type(None, 2, cpu=False)\n"
        "print(type(found).__module__, type(found).__name__, found.visible_count())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [__name__, "DummyDevices", "3"]
