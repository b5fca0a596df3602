"""Tensor trees: nested lists, tuples (named or not) and mappings whose leaves are tensors.

Local helpers only (no process group): walk, move, slice, concatenate and describe such trees.
The collectives that act on them live in :mod:`nb_accel.runtime.collectives.ops`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch

__all__ = [
    "TensorInformation",
    "is_torch_tensor",
    "is_namedtuple",
    "honor_type",
    "rebuild_mapping",
    "recursively_apply",
    "send_to_device",
    "get_data_structure",
    "get_shape",
    "initialize_tensors",
    "find_batch_size",
    "ignorant_find_batch_size",
    "slice_tensors",
    "concatenate",
    "listify",
    "find_device",
    "has_only_tensors",
    "TreeDef",
    "flatten_tree",
    "unflatten_tree",
]


@dataclass(frozen=True)
class TensorInformation:
    """What it takes to allocate a tensor elsewhere: its shape and dtype."""

    shape: torch.Size
    dtype: torch.dtype


def is_torch_tensor(obj: Any) -> bool:
    """True for a ``torch.Tensor``."""
    return isinstance(obj, torch.Tensor)


def is_namedtuple(data: Any) -> bool:
    """True for an instance of a ``collections.namedtuple`` / ``typing.NamedTuple`` class."""
    data_type = type(data)
    fields = getattr(data_type, "_fields", None)
    return (
        data_type.__bases__ == (tuple,)
        and isinstance(fields, tuple)
        and all(isinstance(name, str) for name in fields)
    )


def honor_type(obj: Any, items: Iterable[Any]) -> Any:
    """Build a container of ``obj``'s type (list, tuple or named tuple) from ``items``."""
    if is_namedtuple(obj):
        return type(obj)(*list(items))
    return type(obj)(items)


def rebuild_mapping(like: Mapping[Any, Any], items: dict[Any, Any]) -> Any:
    """A mapping of ``like``'s type holding ``items``."""
    return cast(Any, type(like))(items)


def recursively_apply(
    func: Callable[..., Any],
    data: Any,
    *args: Any,
    test_type: Callable[[Any], bool] = is_torch_tensor,
    error_on_other_type: bool = False,
    **kwargs: Any,
) -> Any:
    """Apply ``func(leaf, *args, **kwargs)`` to every leaf of ``data`` that passes ``test_type``.

    Lists, tuples (named tuples included) and mappings are rebuilt with their own type. Other
    leaves are returned unchanged, or rejected with a ``TypeError`` when
    ``error_on_other_type`` is set.
    """

    def recurse(item: Any) -> Any:
        return recursively_apply(
            func,
            item,
            *args,
            test_type=test_type,
            error_on_other_type=error_on_other_type,
            **kwargs,
        )

    if isinstance(data, (tuple, list)):
        return honor_type(data, (recurse(item) for item in data))
    if isinstance(data, Mapping):
        return rebuild_mapping(data, {key: recurse(value) for key, value in data.items()})
    if test_type(data):
        return func(data, *args, **kwargs)
    if error_on_other_type:
        name = getattr(func, "__name__", "this operation").lstrip("_")
        raise TypeError(
            f"{name} got a {type(data).__name__}; it only accepts tensors, possibly nested in "
            "lists, tuples and dicts (use gather_object for other Python objects)"
        )
    return data


def send_to_device(
    tensor: Any,
    device: torch.device | str | int,
    non_blocking: bool = False,
    skip_keys: str | Sequence[str] | None = None,
) -> Any:
    """Move every tensor of a tree (or any object with ``.to``) to ``device``.

    Args:
        tensor: the tree to move.
        device: where to.
        non_blocking: passed to ``.to`` when it accepts it.
        skip_keys: mapping keys whose values are left where they are.
    """
    if hasattr(tensor, "to"):
        try:
            return tensor.to(device, non_blocking=non_blocking)
        except TypeError:  # a .to() without non_blocking
            return tensor.to(device)
    if isinstance(tensor, (tuple, list)):
        return honor_type(
            tensor, (send_to_device(t, device, non_blocking, skip_keys) for t in tensor)
        )
    if isinstance(tensor, Mapping):
        skipped = {skip_keys} if isinstance(skip_keys, str) else set(skip_keys or ())
        return rebuild_mapping(
            tensor,
            {
                key: value
                if key in skipped
                else send_to_device(value, device, non_blocking, skip_keys)
                for key, value in tensor.items()
            },
        )
    return tensor


def get_data_structure(data: Any) -> Any:
    """The tree with a :class:`TensorInformation` in place of every tensor."""
    return recursively_apply(lambda t: TensorInformation(shape=t.shape, dtype=t.dtype), data)


def get_shape(data: Any) -> Any:
    """The tree with the shape (a list of ints) in place of every tensor."""
    return recursively_apply(lambda t: list(t.shape), data)


def initialize_tensors(data_structure: Any) -> Any:
    """Allocate (uninitialised) tensors for a tree from :func:`get_data_structure`."""
    return recursively_apply(
        lambda info: torch.empty(*info.shape, dtype=info.dtype),
        data_structure,
        test_type=lambda obj: isinstance(obj, TensorInformation),
    )


def find_batch_size(data: Any) -> int:
    """The first dimension of the first tensor found in the tree.

    Raises:
        ValueError: on an empty container.
        TypeError: when the first leaf is not a tensor.
    """
    if isinstance(data, (tuple, list, Mapping)) and len(data) == 0:
        raise ValueError(f"cannot find the batch size of an empty {type(data).__name__}")
    if isinstance(data, (tuple, list)):
        return find_batch_size(data[0])
    if isinstance(data, Mapping):
        return find_batch_size(next(iter(data.values())))
    if not isinstance(data, torch.Tensor):
        raise TypeError(f"can only find the batch size of tensors, not of a {type(data).__name__}")
    return int(data.shape[0]) if data.dim() > 0 else 1


def ignorant_find_batch_size(data: Any) -> int | None:
    """:func:`find_batch_size`, or ``None`` where it would raise."""
    try:
        return find_batch_size(data)
    except (ValueError, TypeError):
        return None


def slice_tensors(
    data: Any,
    tensor_slice: slice,
    process_index: int | None = None,
    num_processes: int | None = None,
) -> Any:
    """Index every tensor of the tree with ``tensor_slice`` (other leaves are kept).

    ``process_index`` and ``num_processes`` are accepted so that a custom slicing function
    for the dispatcher can use them; this one ignores them.
    """
    return recursively_apply(lambda t: t[tensor_slice], data)


def concatenate(data: Sequence[Any], dim: int = 0) -> Any:
    """Concatenate a list of trees of the same structure tensor by tensor along ``dim``.

    Lists, tuples and mappings are rebuilt around their concatenated members; a leaf that is
    no tensor is returned as it is when ``data`` holds a single one (one batch is itself), and
    refused with ``TypeError`` when there are several to join.
    """
    if not data:
        raise IndexError("concatenate needs at least one batch, got an empty sequence")
    first = data[0]
    if isinstance(first, (tuple, list)):
        return honor_type(
            first, (concatenate([d[i] for d in data], dim=dim) for i in range(len(first)))
        )
    if isinstance(first, Mapping):
        merged = {key: concatenate([d[key] for d in data], dim=dim) for key in first}
        return rebuild_mapping(first, merged)
    if not isinstance(first, torch.Tensor):
        if len(data) == 1:
            return first
        raise TypeError(
            f"can only concatenate tensors, not {len(data)} values of type "
            f"{type(first).__name__}: make them tensors, or gather them with gather_object"
        )
    return torch.cat(list(data), dim=dim)


def listify(data: Any) -> Any:
    """Every tensor of the tree as Python numbers (``tensor.tolist()``: a number for a 0-d
    tensor, nested lists otherwise); the containers and other leaves are kept."""
    return recursively_apply(lambda tensor: tensor.tolist(), data)


def find_device(data: Any) -> torch.device | None:
    """The device of the first tensor found in the tree, or ``None`` if there is none."""
    if isinstance(data, torch.Tensor):
        return data.device
    values = data.values() if isinstance(data, Mapping) else data
    if isinstance(data, (Mapping, tuple, list)):
        for item in values:
            device = find_device(item)
            if device is not None:
                return device
    return None


def has_only_tensors(data: Any) -> bool:
    """True when every leaf of the tree is a tensor (and there is at least one leaf)."""
    if isinstance(data, torch.Tensor):
        return True
    if isinstance(data, Mapping):
        return len(data) > 0 and all(has_only_tensors(v) for v in data.values())
    if isinstance(data, (tuple, list)):
        return len(data) > 0 and all(has_only_tensors(v) for v in data)
    return False


#: The structure of a flattened tree: ``None`` for a leaf, ``(type, children)`` for a list or
#: tuple, ``(type, keys, children)`` for a mapping. Comparable with ``==`` and picklable.
TreeDef = Any


def flatten_tree(data: Any) -> tuple[list[Any], TreeDef]:
    """The leaves of a tree in order, and its structure (see :func:`unflatten_tree`)."""
    leaves: list[Any] = []

    def visit(node: Any) -> TreeDef:
        if isinstance(node, (list, tuple)):
            return (type(node), tuple(visit(child) for child in node))
        if isinstance(node, Mapping):
            keys = tuple(node)
            return (type(node), keys, tuple(visit(node[key]) for key in keys))
        leaves.append(node)
        return None

    return leaves, visit(data)


def unflatten_tree(treedef: TreeDef, leaves: Iterable[Any]) -> Any:
    """Rebuild the tree of ``treedef`` (from :func:`flatten_tree`) around ``leaves``."""
    remaining = iter(leaves)

    def build(node: TreeDef) -> Any:
        if node is None:
            return next(remaining)
        if len(node) == 2:
            kind, children = node
            items = [build(child) for child in children]
            if issubclass(kind, tuple) and hasattr(kind, "_fields"):
                return kind(*items)
            return kind(items)
        kind, keys, children = node
        mapping = {key: build(child) for key, child in zip(keys, children, strict=True)}
        return cast(Any, kind)(mapping)

    return build(treedef)
