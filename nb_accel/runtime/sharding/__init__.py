"""Sharding strategies: how prepared models are spread over the processes of a launch. The
interface (``strategy.py``), data parallel (``ddp.py``), FSDP2 (``fsdp2.py``), the state dicts
of models held in parts that both use (``parts.py``) and the one list of them by name
(``registry.py``)."""

from .registry import (
    DEFAULT,
    SHARDING_VARIABLE,
    STRATEGIES,
    choose_strategy,
    default_strategy,
    register_sharding_strategy,
    sharding_for_fsdp,
    sharding_name,
    strategy_class,
    unregister_sharding_strategy,
)
from .strategy import ModelSetup, ShardingStrategy

__all__ = [
    "DEFAULT",
    "SHARDING_VARIABLE",
    "STRATEGIES",
    "ModelSetup",
    "ShardingStrategy",
    "choose_strategy",
    "default_strategy",
    "register_sharding_strategy",
    "sharding_for_fsdp",
    "sharding_name",
    "strategy_class",
    "unregister_sharding_strategy",
]
