"""What a launched function may return: checked in the worker before it travels to the kernel.

Objects that only work inside their worker (the ``Accelerator``, the state objects, prepared
loaders, optimizers and schedulers, process groups) would arrive in the kernel as broken copies
that fail later, far from the cause ("Default process group has not been initialized"), or,
worse, seem to work (a prepared loader that yields rank 0's shard only). Their classes carry a
:data:`WORKER_ONLY` attribute saying what to return instead, and :func:`check_returnable`
refuses them, naming where in the returned value they sit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["WORKER_ONLY", "check_returnable", "find_worker_only"]

#: The class attribute that marks a worker-only type; its value says what to return instead.
WORKER_ONLY = "_nb_accel_worker_only"

#: How deep :func:`find_worker_only` looks into nested containers.
MAX_DEPTH = 8


def _advice(value: Any) -> str | None:
    advice = getattr(type(value), WORKER_ONLY, None)
    if isinstance(advice, str):
        return advice
    if isinstance(value, dist.ProcessGroup):
        return "return plain data (numbers, tensors, lists, dicts): the kernel has no group"
    return None


def _children(value: Any) -> Iterator[tuple[str, Any]]:
    """The items of a container, each with how to reach it (``[0]``, ``['key']``, ``.field``)."""
    if isinstance(value, (str, bytes, bytearray, torch.Tensor, torch.nn.Module)):
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield f"[{key!r}]", item
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield f"[{index}]", item
    elif isinstance(value, (set, frozenset)):
        for item in value:
            yield "{...}", item
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield f".{field.name}", getattr(value, field.name, None)


def find_worker_only(value: Any, where: str = "", depth: int = 0) -> tuple[str, Any, str] | None:
    """The first worker-only object in ``value``: where it sits, the object, and the advice."""
    advice = _advice(value)
    if advice is not None:
        return where, value, advice
    if depth >= MAX_DEPTH:
        return None
    for step, item in _children(value):
        found = find_worker_only(item, where + step, depth + 1)
        if found is not None:
            return found
    return None


def check_returnable(value: Any) -> None:
    """Raise ``TypeError`` if ``value`` holds an object that only works inside its worker (the
    message names no rank, so identical refusals on every rank are reported once)."""
    found = find_worker_only(value)
    if found is None:
        return
    where, culprit, advice = found
    name = type(culprit).__name__
    article = "an" if name[:1].lower() in "aeiou" else "a"
    place = f" (at result{where})" if where else ""
    raise TypeError(
        f"the launched function returned {article} {name}{place}, which only works inside its "
        f"worker process: the kernel would get a broken copy. {advice[0].upper()}{advice[1:]}."
    )
