"""The sharding strategies, by name: the one list the Accelerator, the launch plan and the saved
configuration's names go by. A new strategy is a module implementing
:class:`~nb_accel.runtime.sharding.strategy.ShardingStrategy` and one line in
:data:`nb_accel.config.SHARDING_STRATEGIES`, from which :data:`STRATEGIES` is loaded."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from ...config import SHARDING_STRATEGIES
from .ddp import DataParallelStrategy
from .strategy import ShardingStrategy

__all__ = [
    "DEFAULT",
    "STRATEGIES",
    "choose_strategy",
    "default_strategy",
    "no_sync",
    "strategy_class",
    "sync_in_backward",
    "unwrap_once",
    "worker_only_advice",
]


def _load(name: str, where: str) -> type[ShardingStrategy]:
    """The strategy class at ``where`` (``"module:Class"``), registered as ``name``."""
    module, _, attribute = where.partition(":")
    found = getattr(importlib.import_module(module), attribute)
    if not (isinstance(found, type) and issubclass(found, ShardingStrategy)):
        raise TypeError(f"sharding strategy {name!r}: {where} is not a ShardingStrategy")
    if found.name != name:
        raise TypeError(f"sharding strategy {name!r}: {where} calls itself {found.name!r}")
    return found


#: Every strategy, by the name the launch and the configuration use (the list itself is
#: :data:`nb_accel.config.SHARDING_STRATEGIES`).
STRATEGIES: dict[str, type[ShardingStrategy]] = {
    name: _load(name, where) for name, where in SHARDING_STRATEGIES.items()
}

#: The strategy without options: data parallel (on one process, models as they are).
DEFAULT = DataParallelStrategy.name


def strategy_class(name: str) -> type[ShardingStrategy]:
    """The strategy registered as ``name``; a ``ValueError`` naming the others if none is."""
    try:
        return STRATEGIES[name]
    except KeyError:
        names = ", ".join(repr(n) for n in STRATEGIES)
        raise ValueError(f"sharding={name!r} is not valid; use one of {names}") from None


def choose_strategy(options: Mapping[str, Any]) -> ShardingStrategy:
    """The strategy the Accelerator's ``options`` ask for (e.g. ``fsdp_plugin``: FSDP2), else
    the default."""
    for name, strategy in STRATEGIES.items():
        chosen = None if name == DEFAULT else strategy.from_options(options)
        if chosen is not None:
            return chosen
    return default_strategy()


def default_strategy() -> ShardingStrategy:
    """The strategy asked for by no option: data parallel."""
    return DataParallelStrategy()


def unwrap_once(model: torch.nn.Module) -> torch.nn.Module | None:
    """The model inside a strategy's wrapper ``model``; None when no strategy wrapped it."""
    for strategy in STRATEGIES.values():
        inner = strategy.unwrap(model)
        if inner is not None:
            return inner
    return None


@contextlib.contextmanager
def no_sync(model: torch.nn.Module) -> Iterator[None]:
    """Keep the gradients of ``model``'s backward passes unsynchronised inside the block,
    however it was prepared (each strategy acts on the models it prepared only)."""
    with contextlib.ExitStack() as stack:
        for strategy in STRATEGIES.values():
            stack.enter_context(strategy.no_sync(model))
        yield


@contextlib.contextmanager
def sync_in_backward(model: torch.nn.Module) -> Iterator[None]:
    """Make the next backward pass of ``model`` synchronise its gradients, however it was
    prepared (each strategy acts on the models it prepared only)."""
    with contextlib.ExitStack() as stack:
        for strategy in STRATEGIES.values():
            stack.enter_context(strategy.sync_in_backward(model))
        yield


def worker_only_advice(value: Any) -> str | None:
    """What to return instead of ``value`` when it is some strategy's worker-only part."""
    for strategy in STRATEGIES.values():
        advice = strategy.worker_only_advice(value)
        if advice is not None:
            return advice
    return None
