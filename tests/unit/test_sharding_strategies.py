"""The sharding strategies: every registered one implements the interface, the launch side and
the saved configuration go by the registry's names, and the state chooses one strategy once."""

from __future__ import annotations

import contextlib
import inspect
import warnings

import pytest
import torch
from plans import plan_of
from torch import nn

import nb_accel
from nb_accel import DistributedType, FullyShardedDataParallelPlugin
from nb_accel.config import CHOICES, Config, ConfigError
from nb_accel.launch.workers import sharding_env
from nb_accel.runtime.sharding import (
    DEFAULT,
    STRATEGIES,
    ShardingStrategy,
    choose_strategy,
    sharding_for_fsdp,
)
from nb_accel.runtime.sharding.registry import unwrap_once, worker_only_advice
from nb_accel.runtime.state import AcceleratorState


def _interface() -> list[str]:
    """The public methods and properties the interface declares."""
    return [
        name
        for name, member in vars(ShardingStrategy).items()
        if not name.startswith("_") and (callable(member) or isinstance(member, classmethod))
    ]


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_every_registered_strategy_implements_the_interface(name: str) -> None:
    strategy = STRATEGIES[name]
    assert issubclass(strategy, ShardingStrategy)
    assert not inspect.isabstract(strategy), f"{name}: {strategy.__abstractmethods__}"
    assert strategy.name == name
    assert isinstance(strategy.label, str) and strategy.label
    for method in _interface():
        assert callable(getattr(strategy, method)), f"{name} lacks {method}"
    env = strategy.worker_env()
    assert env and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    title = strategy.launch_title(2)
    assert title is None or isinstance(title, str)


def test_the_configuration_and_the_launch_name_the_registered_strategies() -> None:
    assert tuple(STRATEGIES) == tuple(CHOICES["sharding"])
    assert DEFAULT in STRATEGIES and Config().sharding == DEFAULT
    assert {sharding_for_fsdp(True), sharding_for_fsdp(False)} <= set(STRATEGIES)
    for name in STRATEGIES:
        assert Config(sharding=name).sharding == name
        assert (
            plan_of(num_processes=2, start_method="fork", cpu=True, sharding=name).sharding == name
        )
        assert sharding_env(name) == STRATEGIES[name].worker_env()
    with pytest.raises(ConfigError):
        Config(sharding="zero3")
    with pytest.raises(ValueError, match="use one of 'ddp', 'fsdp2'"):
        plan_of(num_processes=2, start_method="fork", cpu=True, sharding="zero3")
    with pytest.raises(ValueError, match="use one of"):
        sharding_env("zero3")


def test_the_options_choose_the_strategy() -> None:
    assert choose_strategy({}).name == DEFAULT
    assert choose_strategy({"fsdp_plugin": None}).name == DEFAULT
    plugin = FullyShardedDataParallelPlugin()
    chosen = choose_strategy({"fsdp_plugin": plugin})
    assert chosen.name == "fsdp2" and chosen.plugin is plugin  # type: ignore[attr-defined]
    for kind in (DistributedType.MULTI_CPU, DistributedType.MULTI_GPU):
        assert chosen.runs_on(kind) and chosen.distributed_type(kind) == DistributedType.FSDP
    for kind in (DistributedType.NO, DistributedType.XLA):
        assert not chosen.runs_on(kind) and chosen.distributed_type(kind) == kind
    data_parallel = choose_strategy({})
    assert data_parallel.runs_on(DistributedType.NO)
    assert data_parallel.distributed_type(DistributedType.MULTI_CPU) == DistributedType.MULTI_CPU


def test_the_state_keeps_the_chosen_strategy_and_runs_the_one_that_applies() -> None:
    with pytest.warns(UserWarning, match="single process"):
        accelerator = nb_accel.Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())
    state = AcceleratorState()
    assert state.chosen_sharding.name == "fsdp2"  # asked for...
    assert state.sharding.name == DEFAULT  # ...but one process: models prepared as they are
    assert accelerator.distributed_type == DistributedType.NO
    state.distributed_type = DistributedType.MULTI_CPU  # as Accelerate's tests assign it
    assert state.sharding.name == "fsdp2" and accelerator.is_fsdp2


def test_a_plain_accelerator_runs_data_parallel() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        accelerator = nb_accel.Accelerator()
    assert AcceleratorState().chosen_sharding.name == DEFAULT
    assert not accelerator.is_fsdp2 and accelerator.fsdp_plugin is None
    model = nn.Linear(2, 2)
    assert accelerator.prepare(model) is model  # one process: nothing to wrap


def test_a_plain_model_is_no_strategys_wrapper_nor_a_shard() -> None:
    model = nn.Linear(2, 2)
    assert unwrap_once(model) is None
    assert worker_only_advice(model) is None and worker_only_advice(torch.ones(1)) is None
    with contextlib.ExitStack() as stack:
        for strategy in STRATEGIES.values():  # a no-op for a model no strategy prepared
            stack.enter_context(strategy.no_sync(model))
            stack.enter_context(strategy.sync_in_backward(model))
