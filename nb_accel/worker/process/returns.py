"""What a launched function may return: checked in the worker before it travels to the kernel.

Objects that only work inside their worker (the ``Accelerator``, the state objects, prepared
loaders, optimizers and schedulers, process groups) would arrive in the kernel as broken copies
that fail later, far from the cause ("Default process group has not been initialized"), or,
worse, seem to work (a prepared loader that yields rank 0's shard only). Their classes carry a
:data:`WORKER_ONLY` attribute saying what to return instead, and :func:`check_returnable`
refuses them, naming where in the returned value they sit.

What may travel is pickled by :func:`dumps_result`, which rebuilds every tensor, storage and
model on the CPU wherever it sits (a dataclass field, a named tuple, an object's attribute or
slot, any nesting): unpickling a CUDA tensor in the kernel would initialise CUDA there, and the
next launch could not fork its workers. Big tensors and arrays are written once into the
launch's shared memory, which the kernel maps, instead of through the pipe.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist

from ...runtime.device_types.cpu import in_cpu_memory
from ...runtime.sharding.registry import unwrap_once, worker_only_advice
from ...runtime.tree import recursively_apply
from ..transfer.pickling import (
    PROTOCOL,
    SharingCloudPickler,
    SharingPickler,
    pickle_sharing,
    storage_reduction,
)
from ..transfer.segments import segment_dir

__all__ = [
    "WORKER_ONLY",
    "check_returnable",
    "cpu_reduction",
    "dumps_result",
    "find_worker_only",
    "to_cpu",
]

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
    return worker_only_advice(value)  # a sharding strategy's part (a shard)


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


def _on_cpu(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU copy of ``tensor``, a ``Parameter`` again if it was one, with its ``requires_grad``
    and its Python attributes."""
    moved = tensor.detach().to("cpu")
    if isinstance(tensor, torch.nn.Parameter):
        moved = torch.nn.Parameter(moved, requires_grad=tensor.requires_grad)
    elif tensor.requires_grad:
        moved.requires_grad_(True)
    if getattr(tensor, "__dict__", None):
        moved.__dict__.update(tensor.__dict__)
    return moved


def _unwrapped(module: torch.nn.Module) -> torch.nn.Module:
    """What a pickled strategy's wrapper (``DistributedDataParallel``) becomes in the kernel:
    the model it wraps."""
    return module


def cpu_reduction(obj: Any, protocol: int = PROTOCOL) -> Any:
    """How to pickle ``obj`` so that it is rebuilt on the CPU (a ``__reduce__`` value) for a
    tensor or storage on another device and for a ``DistributedDataParallel`` (its model);
    a storage's bytes as one buffer (:func:`storage_reduction`); ``NotImplemented`` for
    anything else, which pickles as usual. Meta tensors, which hold no data, stay meta."""
    if isinstance(obj, torch.Tensor):
        if in_cpu_memory(obj.device) or obj.is_meta:
            return NotImplemented
        return _on_cpu(obj).__reduce_ex__(protocol)
    if isinstance(obj, (torch.UntypedStorage, torch.TypedStorage)):
        # A TypedStorage's own ``device`` warns that the class is deprecated; ask its bytes.
        untyped = obj if isinstance(obj, torch.UntypedStorage) else obj._untyped_storage
        if untyped.device.type == "meta":
            return NotImplemented
        return storage_reduction(obj if in_cpu_memory(untyped.device) else obj.cpu())
    if isinstance(obj, torch.nn.Module):
        inner = unwrap_once(obj)  # a strategy's wrapper, such as DistributedDataParallel
        if inner is not None:
            return _unwrapped, (inner,)
    return NotImplemented


class _CpuPickler(SharingPickler):
    """``pickle`` (by reference) with :func:`cpu_reduction`."""

    def reducer_override(self, obj: Any) -> Any:
        """See :func:`cpu_reduction`."""
        return cpu_reduction(obj)


class _CpuCloudPickler(SharingCloudPickler):
    """``cloudpickle`` (classes and functions of the notebook by value) with
    :func:`cpu_reduction`."""

    def reducer_override(self, obj: Any) -> Any:
        """See :func:`cpu_reduction`; cloudpickle's own handling for anything else."""
        reduced = cpu_reduction(obj)
        return super().reducer_override(obj) if reduced is NotImplemented else reduced


def dumps_result(value: Any, shared: bool = True) -> bytes:
    """Pickle ``value`` for the kernel, every tensor, storage and model in it on the CPU.

    By reference where that unpickles (class identity is kept), else by value (cloudpickle).
    With ``shared``, big buffers are written into the launch's shared memory (the kernel
    loads the bytes with :func:`~nb_accel.worker.transfer.pickling.loads`). Raises what
    pickling raises for a value that cannot be sent.
    """
    try:
        pickled = pickle_sharing(value, _CpuPickler)
        pickled.load()  # its big buffers are this process's own: no copy
    except Exception:  # noqa: BLE001 - by value instead
        pickled = pickle_sharing(value, _CpuCloudPickler)
    return pickled.seal(segment_dir() if shared else None)


def _leaf_to_cpu(value: Any) -> Any:
    if isinstance(value, torch.nn.Module):
        value = unwrap_once(value) or value  # a strategy's wrapper: its model
        return value.to("cpu")
    return value if in_cpu_memory(value.device) else value.detach().cpu()


def to_cpu(value: Any) -> Any:
    """Move tensors and modules in ``value`` to the CPU (lists, tuples, dicts, nesting)."""
    return recursively_apply(
        _leaf_to_cpu, value, test_type=lambda x: isinstance(x, (torch.Tensor, torch.nn.Module))
    )
