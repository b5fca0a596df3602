"""The sharding strategies, by name: the one registry the Accelerator, the launch plan and the
saved configuration's names go by (:data:`nb_accel.config.SHARDING_STRATEGIES`, read here as
:data:`STRATEGIES`). A new strategy is a module implementing
:class:`~nb_accel.runtime.sharding.strategy.ShardingStrategy` and one line there, or one
:func:`register_sharding_strategy` call at run time. Names are compared here only: the launch,
the magics and the form ask :func:`sharding_name` and :func:`sharding_for_fsdp`; a launch names
its strategy in its ranks' :data:`SHARDING_VARIABLE`, and :func:`choose_strategy` takes it."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any, cast

import torch

from ..._registry import Registry
from ...config import SHARDING_ALIASES, SHARDING_STRATEGIES
from .ddp import DataParallelStrategy
from .fsdp2 import FullyShardedStrategy
from .strategy import ShardingStrategy

__all__ = [
    "DEFAULT",
    "SHARDING_VARIABLE",
    "STRATEGIES",
    "checked_strategy",
    "choose_strategy",
    "default_strategy",
    "no_sync",
    "register_sharding_strategy",
    "sharding_for_fsdp",
    "sharding_name",
    "strategy_class",
    "sync_in_backward",
    "unregister_sharding_strategy",
    "unwrap_once",
    "worker_only_advice",
]

#: The variable a launch sets in its ranks: the name of the strategy it runs with.
SHARDING_VARIABLE = "NB_ACCEL_SHARDING"


def checked_strategy(name: str, found: object) -> type[ShardingStrategy]:
    """``found``, a strategy class declared or built in as ``name``, checked."""
    if not (isinstance(found, type) and issubclass(found, ShardingStrategy)):
        raise TypeError(f"sharding strategy {name!r}: {found!r} is not a ShardingStrategy")
    if found.name != name:
        raise TypeError(f"sharding strategy {name!r}: {found!r} calls itself {found.name!r}")
    return found


#: Every strategy, by the name the launch and the configuration use, in the order they are
#: asked: registered (newest first), declared, built in (the same registry as
#: :data:`nb_accel.config.SHARDING_STRATEGIES`).
STRATEGIES = cast(Registry[type[ShardingStrategy]], SHARDING_STRATEGIES)

#: The strategy without options: data parallel (on one process, models as they are).
DEFAULT = DataParallelStrategy.name


def sharding_name(name: object) -> str:
    """The registered name ``name`` stands for (itself, or the strategy an alias such as
    ``"fsdp"`` names; case aside); a ``ValueError`` naming the strategies when none is."""
    key = name.lower() if isinstance(name, str) else name
    key = SHARDING_ALIASES.get(key, key) if isinstance(key, str) else key
    if not isinstance(key, str) or key not in STRATEGIES:
        names = ", ".join(repr(n) for n in sorted(STRATEGIES))  # the same order every time
        raise ValueError(f"sharding={name!r} is not valid; use one of {names}")
    return key


def strategy_class(name: str) -> type[ShardingStrategy]:
    """The strategy registered as ``name`` (or an alias of it); a ``ValueError`` naming the
    others if none is."""
    return STRATEGIES[sharding_name(name)]


def sharding_for_fsdp(fsdp: bool) -> str:
    """The strategy Accelerate's spelling asks for: ``fsdp=True`` FSDP2, ``False`` the
    default (data parallel)."""
    return FullyShardedStrategy.name if fsdp else DEFAULT


def register_sharding_strategy(strategy: type[ShardingStrategy]) -> None:
    """Make ``strategy`` a sharding strategy launches, the magics, the saved configuration and
    the Accelerator can name, as ``strategy.name``: a launch that names it has its ranks'
    ``Accelerator()`` choose it (see :func:`choose_strategy`)."""
    if not (isinstance(strategy, type) and issubclass(strategy, ShardingStrategy)):
        raise TypeError(f"{strategy!r} is not a ShardingStrategy subclass")
    STRATEGIES.register(strategy.name, strategy)


def unregister_sharding_strategy(name: str) -> None:
    """Forget a strategy :func:`register_sharding_strategy` added (the built-in ones stay)."""
    STRATEGIES.unregister(name)


def choose_strategy(options: Mapping[str, Any]) -> ShardingStrategy:
    """The strategy the Accelerator's ``options`` ask for (e.g. ``fsdp_plugin``: FSDP2), else
    the default. Each is asked with ``options["sharding"]``, the strategy the launch named in
    :data:`SHARDING_VARIABLE`, that one first: a registered strategy needs no variable of its
    own to be chosen in the ranks of a launch that names it."""
    named = os.environ.get(SHARDING_VARIABLE) or None
    asked = {"sharding": named, **options}
    first = [named] if named is not None and named != DEFAULT else []
    for name in dict.fromkeys([*first, *STRATEGIES]):
        chosen = None if name == DEFAULT else STRATEGIES[name].from_options(asked)
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
