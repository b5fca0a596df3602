"""Which submodules of a model become their own FSDP unit, and which are left out of sharding.

Each unit's parameters are gathered for its forward and backward and freed after, so units the
size of one transformer block keep the gathered memory small. The policies are Accelerate's:
by layer class (``transformer_based_wrap``), by size (``size_based_wrap``), none (``no_wrap``), or
a function; torch's FSDP1 policy functions are understood too.

Every policy by layer class finds its classes the same way when none are named (the default,
``"transformer_based_wrap"``, torch's ``transformer_auto_wrap_policy`` without
``transformer_layer_cls``, and so Accelerate's own plugin): a 🤗 model's ``_no_split_modules``,
else torch's ``nn.Transformer*Layer`` layers. Finding none is an error for a policy that asked
for layers, and said once for the default, under which the whole model is then one unit.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .notices import say_no_effect, say_once
from .plugin import FullyShardedDataParallelPlugin

__all__ = ["ignored_modules", "wrapped_modules"]

_TORCH_LAYERS = (torch.nn.TransformerEncoderLayer, torch.nn.TransformerDecoderLayer)


def _post_order(module: torch.nn.Module, prefix: str = "") -> Iterator[tuple[str, torch.nn.Module]]:
    for name, child in module.named_children():
        yield from _post_order(child, f"{prefix}{name}.")
        yield f"{prefix}{name}", child


def ignored_modules(
    model: torch.nn.Module, plugin: FullyShardedDataParallelPlugin
) -> list[torch.nn.Module]:
    """The modules ``plugin.ignored_modules`` names: modules of ``model``, or a regular
    expression matched against the whole of each submodule's name."""
    given = plugin.ignored_modules
    if given is None:
        return []
    if isinstance(given, str):
        pattern = re.compile(given)
        found = [m for name, m in model.named_modules() if name and pattern.fullmatch(name)]
        if not found:
            raise ValueError(
                f"ignored_modules={given!r} matches no submodule name of "
                f"{type(model).__name__} (names look like "
                f"{', '.join(repr(n) for n, _ in list(model.named_modules())[1:4])}...)"
            )
        return found
    modules = list(given)
    inside = {id(m) for m in model.modules()}
    strangers = [type(m).__name__ for m in modules if id(m) not in inside]
    if strangers:
        raise ValueError(
            f"ignored_modules holds modules that are not part of {type(model).__name__}: "
            f"{', '.join(strangers)}"
        )
    return modules


def _class_names(model: torch.nn.Module) -> list[str]:
    return sorted({type(m).__name__ for m in model.modules()})


def _by_class_names(model: torch.nn.Module, names: list[str]) -> Callable[[torch.nn.Module], bool]:
    present = set(_class_names(model))
    missing = [name for name in names if name not in present]
    if missing:
        raise ValueError(
            f"transformer_cls_names_to_wrap names {missing}, which {type(model).__name__} does "
            f"not contain; its layer classes are: {', '.join(_class_names(model))}"
        )
    wanted = set(names)
    return lambda module: type(module).__name__ in wanted


def _torch_policy(policy: Any) -> tuple[str, dict[str, Any]] | None:
    """``("transformer", {...})``/``("size", {...})`` for torch's FSDP1 policy functions (or a
    ``functools.partial`` of them), ``None`` for anything else."""
    from torch.distributed.fsdp import wrap

    keywords: dict[str, Any] = {}
    if isinstance(policy, functools.partial):
        keywords = dict(policy.keywords)
        policy = policy.func
    if policy is wrap.transformer_auto_wrap_policy:
        return "transformer", keywords
    if policy is wrap.size_based_auto_wrap_policy:
        return "size", keywords
    return None


def _numel(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _size_based(
    model: torch.nn.Module, min_num_params: int, skip: set[int]
) -> list[tuple[str, torch.nn.Module]]:
    """Post-order: a submodule becomes a unit when the parameters of it not already in a unit
    below reach ``min_num_params``."""
    chosen: list[tuple[str, torch.nn.Module]] = []
    taken: set[int] = set()
    for name, module in _post_order(model):
        if id(module) in skip:
            continue
        free = sum(p.numel() for p in module.parameters() if id(p) not in taken)
        if free >= min_num_params and free > 0:
            chosen.append((name, module))
            taken.update(id(p) for p in module.parameters())
    return chosen


def _user_policy(policy: Callable[..., Any]) -> Callable[[torch.nn.Module], bool]:
    def decide(module: torch.nn.Module) -> bool:
        try:
            return bool(policy(module))
        except TypeError:  # torch's FSDP1 signature
            return bool(policy(module=module, recurse=False, nonwrapped_numel=_numel(module)))

    return decide


def _found_layers(
    model: torch.nn.Module, names: list[str]
) -> Callable[[torch.nn.Module], bool] | None:
    """By the classes ``names``, else by the model's ``_no_split_modules`` that it contains,
    else by torch's transformer layers; None when there are none of these."""
    if names:
        return _by_class_names(model, names)
    present = set(_class_names(model))
    hinted = [name for name in getattr(model, "_no_split_modules", None) or [] if name in present]
    if hinted:
        return _by_class_names(model, hinted)
    if any(isinstance(m, _TORCH_LAYERS) for m in model.modules()):
        return lambda module: isinstance(module, _TORCH_LAYERS)
    return None


def _no_layers_error(model: torch.nn.Module, policy: str) -> ValueError:
    return ValueError(
        f"auto_wrap_policy={policy} needs the layer classes to shard: "
        f"transformer_cls_names_to_wrap=[...]. {type(model).__name__} has no "
        "_no_split_modules and no nn.TransformerEncoderLayer/DecoderLayer to take instead "
        f"(its classes: {', '.join(_class_names(model))})"
    )


def _unused(plugin: FullyShardedDataParallelPlugin, policy: str, reads: str) -> None:
    """Say once that the class names or the size threshold (those the policy does not
    ``reads``: ``"classes"``, ``"size"`` or ``""``) do nothing under ``policy``."""
    if plugin.transformer_cls_names_to_wrap and reads != "classes":
        say_no_effect(
            "transformer_cls_names_to_wrap",
            f"auto_wrap_policy={policy} does not choose layers by class",
            stacklevel=4,
        )
    if plugin.min_num_params is not None and reads != "size":
        say_no_effect(
            "min_num_params",
            f"auto_wrap_policy={policy} does not choose layers by size",
            stacklevel=4,
        )


def _by_layers(
    model: torch.nn.Module, plugin: FullyShardedDataParallelPlugin, policy: str
) -> Callable[[torch.nn.Module], bool] | None:
    """The rule of a policy by layer class (``policy``: its name in messages)."""
    _unused(plugin, policy, "classes")
    rule = _found_layers(model, list(plugin.transformer_cls_names_to_wrap or []))
    if rule is not None:
        return rule
    if plugin.auto_wrap_policy is not None:
        raise _no_layers_error(model, policy)
    say_once(
        "auto_wrap_policy",
        f"{type(model).__name__} has no layer to make its own unit (no "
        "transformer_cls_names_to_wrap, _no_split_modules or nn.Transformer*Layer), so the whole "
        "model is one FSDP unit, gathered whole for its forward and backward. Name its layers "
        "with transformer_cls_names_to_wrap=[...], or choose auto_wrap_policy='size_based_wrap' "
        "or 'no_wrap'",
        stacklevel=4,
    )
    return None


def _choose(
    model: torch.nn.Module, plugin: FullyShardedDataParallelPlugin
) -> Callable[[torch.nn.Module], bool] | int | None:
    """A predicate on modules, a size threshold, or None (no unit below the model)."""
    policy = plugin.auto_wrap_policy
    if policy is None or policy == "transformer_based_wrap":
        return _by_layers(model, plugin, repr(policy))
    if policy == "no_wrap":
        _unused(plugin, repr(policy), "")
        return None
    if policy == "size_based_wrap":
        _unused(plugin, repr(policy), "size")
        return int(plugin.min_num_params or 0)
    known = _torch_policy(policy)
    if known is None:
        _unused(plugin, "a function", "")
        return _user_policy(policy)  # type: ignore[arg-type]
    kind, keywords = known
    name = "size_based_auto_wrap_policy" if kind == "size" else "transformer_auto_wrap_policy"
    if kind == "size":
        _unused(plugin, name, "size")
        return int(keywords.get("min_num_params", plugin.min_num_params or 100_000_000))
    classes = tuple(keywords.get("transformer_layer_cls") or ())
    if classes:
        _unused(plugin, name, "")
        return lambda module: isinstance(module, classes)
    return _by_layers(model, plugin, name)


def wrapped_modules(
    model: torch.nn.Module,
    plugin: FullyShardedDataParallelPlugin,
    ignored: list[torch.nn.Module] | None = None,
) -> list[tuple[str, torch.nn.Module]]:
    """The submodules (never ``model`` itself) that become FSDP units, children before their
    parents, with their names; none inside an ignored module or without parameters."""
    skip: set[int] = set()
    for module in ignored or []:
        skip.update(id(m) for m in module.modules())
    rule = _choose(model, plugin)
    if rule is None:
        return []
    if isinstance(rule, int):
        return _size_based(model, rule, skip)
    return [
        (name, module)
        for name, module in _post_order(model)
        if id(module) not in skip and rule(module) and _numel(module) > 0
    ]
