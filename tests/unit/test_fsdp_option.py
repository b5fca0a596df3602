"""Turning FSDP on from the launch side: the ``fsdp`` option, the saved ``sharding``, the plan's
title, the workers' environment, and mistakes refused before any process starts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import psutil
import pytest
import yaml
from plans import plan_of

from nb_accel import debug_launcher, notebook_launcher
from nb_accel.config import Config, ConfigError, load_config, save_config, write_basic_config
from nb_accel.launch.backends import register_launch_backend, unregister_launch_backend
from nb_accel.launch.launchers.backend import LaunchBackend
from nb_accel.launch.pool import WorkerPool
from nb_accel.launch.spec import LaunchSpec
from nb_accel.launch.workers import worker_env
from nb_accel.runtime.xla.device_type import XlaDevices
from nb_accel.worker.process.spec import WorkerArgs


def _noop() -> int:
    return 0


def _assert_nothing_launched(capsys: pytest.CaptureFixture[str]) -> None:
    assert "Launching" not in capsys.readouterr().out
    assert psutil.Process().children(recursive=True) == []


@pytest.fixture
def saved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The saved configuration's file, under ``tmp_path`` (not written yet)."""
    file = tmp_path / "config.yaml"
    monkeypatch.setenv("NB_ACCEL_CONFIG_FILE", str(file))
    return file


# -- the plan and its title ----------------------------------------------------------------------


def test_the_title_names_fsdp_and_its_shards() -> None:
    plan = plan_of(num_processes=2, start_method="fork", cpu=True, sharding="fsdp")
    assert plan.sharding == "fsdp2"  # "fsdp" is the name earlier releases saved
    assert plan.describe() == "Launching 2 processes on CPU (gloo; fork, FSDP, 2 shards)"
    plan = plan_of(
        num_processes=1, mixed_precision="bf16", start_method="spawn", cpu=True, sharding="fsdp"
    )
    assert plan.describe() == (
        "Launching 1 process on CPU (gloo; spawn, bf16 mixed precision, FSDP, 1 shard)"
    )
    # Several nodes: one shard per rank of the whole launch.
    assert plan.describe(world_size=4).endswith("FSDP, 4 shards)")


def test_ddp_is_the_default_and_its_title_is_unchanged() -> None:
    plan = plan_of(num_processes=2, start_method="fork", cpu=True)
    assert plan.sharding == "ddp"
    assert plan.describe() == "Launching 2 processes on CPU (gloo; fork)"
    assert plan.describe(world_size=4) == plan.describe()


def test_fsdp_takes_the_saved_sharding_when_left_out_and_wins_when_given() -> None:
    fsdp_saved = Config(sharding="fsdp")
    assert plan_of(fsdp_saved, num_processes=2, cpu=True).sharding == "fsdp2"
    assert plan_of(fsdp_saved, num_processes=2, cpu=True, fsdp=False).sharding == "ddp"
    assert plan_of(Config(), num_processes=2, cpu=True).sharding == "ddp"
    assert plan_of(Config(), num_processes=2, cpu=True, fsdp=True).sharding == "fsdp2"


def test_sharding_names_the_strategy_and_agrees_with_fsdp() -> None:
    assert plan_of(num_processes=2, cpu=True, sharding="fsdp2").sharding == "fsdp2"
    assert plan_of(num_processes=2, cpu=True, sharding="FSDP2", fsdp=True).sharding == "fsdp2"
    assert plan_of(Config(sharding="fsdp2"), num_processes=2, sharding="ddp").sharding == "ddp"
    with pytest.raises(ValueError, match=r"sharding='ddp' and fsdp=True ask for different"):
        plan_of(num_processes=2, cpu=True, sharding="ddp", fsdp=True)


def test_the_pool_plans_with_fsdp_too(saved: Path) -> None:
    assert WorkerPool(2, cpu=True, fsdp=True).plan.sharding == "fsdp2"  # planned, not started
    assert WorkerPool(2, cpu=True, sharding="fsdp2").plan.sharding == "fsdp2"
    assert WorkerPool(2, cpu=True).plan.sharding == "ddp"
    save_config(Config(sharding="fsdp"), saved)
    pool = WorkerPool(2, cpu=True)
    assert pool.plan.sharding == "fsdp2"
    assert "FSDP, 2 shards" in pool.plan.describe()


# -- mistakes, before any process starts --------------------------------------------------------


@pytest.mark.parametrize("bad", ["yes", "fsdp", 1, 0])
def test_fsdp_must_be_a_bool(bad: object, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(TypeError, match=r"fsdp must be True, False or None"):
        notebook_launcher(_noop, num_processes=2, fsdp=bad)  # type: ignore[arg-type]
    _assert_nothing_launched(capsys)
    with pytest.raises(TypeError, match=rf"got {bad!r}"):
        debug_launcher(_noop, fsdp=bad)  # type: ignore[arg-type]
    _assert_nothing_launched(capsys)


def test_an_unknown_sharding_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"sharding='zero3' is not valid; use one of 'ddp'"):
        plan_of(num_processes=2, cpu=True, sharding="zero3")


class _PretendXla(LaunchBackend):
    """Runs what an XLA launch would run, recording its spec instead of starting anything."""

    name = "xla"
    specs: ClassVar[list[LaunchSpec]] = []

    @classmethod
    def runs(cls, spec: LaunchSpec) -> bool:
        return spec.device.launcher == cls.name

    def start(self) -> None:
        self.specs.append(self.spec)

    def wait(self) -> list[str]:
        return ["xla"]

    def stop(self, graceful: bool = False) -> None:
        del graceful


def _pretend_xla(monkeypatch: pytest.MonkeyPatch) -> list[LaunchSpec]:
    """A TPU runtime as far as the launch can tell: one XLA device, whose launches the
    recording backend above runs."""
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    monkeypatch.setattr(XlaDevices, "ranks_per_node", lambda self, requested: 1)
    monkeypatch.setattr(XlaDevices, "forks_safely", lambda self: True)
    monkeypatch.setattr(XlaDevices, "describe_launch", lambda self, n, b: ("1 rank", b))
    register_launch_backend(_PretendXla)
    monkeypatch.setattr(_PretendXla, "specs", [])
    return _PretendXla.specs


@pytest.fixture
def unregister() -> Iterator[None]:
    yield
    unregister_launch_backend(_PretendXla)


def test_an_xla_launch_refuses_fsdp(
    saved: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    unregister: None,
) -> None:
    calls = _pretend_xla(monkeypatch)
    with pytest.raises(ValueError, match=r"fsdp=True, but this launch runs on XLA devices") as info:
        notebook_launcher(_noop, fsdp=True, cpu=False)
    assert "fsdp=False" in str(info.value) and "cpu=True" in str(info.value)
    save_config(Config(sharding="fsdp"), saved)
    with pytest.raises(ValueError, match=rf"the saved configuration \({saved}\) has sharding"):
        notebook_launcher(_noop, cpu=False)
    _assert_nothing_launched(capsys)
    assert calls == []
    assert notebook_launcher(_noop, fsdp=False, cpu=False) == ["xla"]  # DDP on XLA, as before
    assert [spec.plan.sharding for spec in calls] == ["ddp"]


# -- the saved configuration ---------------------------------------------------------------------


def test_the_saved_sharding_is_checked_and_round_trips(tmp_path: Path) -> None:
    assert Config().sharding == "ddp"
    with pytest.raises(ConfigError, match=r"sharding: must be one of 'ddp', 'fsdp2', got 'zero'"):
        Config(sharding="zero")
    file = tmp_path / "c.yaml"
    save_config(Config(sharding="fsdp", num_processes=2), file)  # the earlier name
    assert yaml.safe_load(file.read_text())["sharding"] == "fsdp2"
    assert load_config(file) == Config(sharding="fsdp2", num_processes=2)
    file.write_text("sharding: fsdp\n")  # a file an earlier release saved
    assert load_config(file).sharding == "fsdp2"


def test_an_older_file_without_sharding_still_loads(tmp_path: Path) -> None:
    file = tmp_path / "c.yaml"
    file.write_text("num_processes: 2\nmixed_precision: bf16\ntimeout: 60\n")
    assert load_config(file) == Config(num_processes=2, mixed_precision="bf16", timeout=60.0)
    assert load_config(file).sharding == "ddp"


def test_a_hand_written_sharding_in_capitals_is_understood(tmp_path: Path) -> None:
    file = tmp_path / "c.yaml"
    file.write_text("sharding: FSDP2\n")
    assert load_config(file).sharding == "fsdp2"
    file.write_text("sharding: true\n")
    with pytest.raises(ConfigError, match=rf"{file}: sharding: must be one of"):
        load_config(file)


def test_write_basic_config_saves_ddp(tmp_path: Path) -> None:
    file = tmp_path / "basic.yaml"
    assert write_basic_config("bf16", file) == file
    assert load_config(file) == Config(mixed_precision="bf16", sharding="ddp")


# -- the workers' environment --------------------------------------------------------------------


def test_fsdp_workers_are_told_to_shard_with_fsdp2() -> None:
    env = worker_env(plan_of(num_processes=2, cpu=True, sharding="fsdp"))
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_VERSION"] == "2"
    node_env = worker_env(plan_of(num_processes=2, cpu=True, sharding="fsdp"), False)
    assert node_env["ACCELERATE_USE_FSDP"] == "true"  # a multi-node launch's workers too


def test_ddp_workers_override_a_leftover_in_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    env = worker_env(plan_of(num_processes=2, cpu=True))
    assert env["ACCELERATE_USE_FSDP"] == "false" and "FSDP_VERSION" not in env
    args = WorkerArgs(0, 0, 2, 2, 0, "store", "gloo", "cpu", 60.0, "no", b"", 1, env=env)
    assert args.rank_environment()["ACCELERATE_USE_FSDP"] == "false"  # what the worker sets
