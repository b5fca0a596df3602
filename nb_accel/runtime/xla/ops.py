"""Collectives on tensor trees between the ranks of an XLA launch, with ``xm`` primitives.

The XLA counterparts of :mod:`nb_accel.runtime.collectives.ops`, which reaches them through the XLA
device backend (:mod:`.backend`) when the launch runs on XLA (same arguments, same results).
Tensors that are not on the XLA device are moved there for the collective and the result is
moved back. Python objects travel pickled (XLA tensors inside lists, tuples and dicts go as
CPU tensors) in byte rows of a few fixed widths (:mod:`.object_rows`), so that gathering
objects of ever new sizes reuses a few compiled graphs instead of compiling one per size as
``xm.rendezvous`` does. Every collective here builds the same graph on every rank, which XLA
needs where one process runs several ranks (TPU v2/v3). Imported only on the XLA path.
"""

from __future__ import annotations

import pickle
from typing import Any

import torch
import torch_xla.core.xla_model as xm

from ..tree import recursively_apply
from .device import global_ordinal, is_xla_tensor, mark_step, world_size, xla_device
from .object_rows import pack_row, row_width, unpack_rows

__all__ = [
    "barrier",
    "exchange_objects",
    "gather",
    "gather_object",
    "reduce",
    "broadcast",
    "broadcast_object_list",
    "largest_sizes",
]

_REDUCE_OPS = {
    "mean": xm.REDUCE_SUM,
    "sum": xm.REDUCE_SUM,
    "none": xm.REDUCE_SUM,
    "max": xm.REDUCE_MAX,
    "min": xm.REDUCE_MIN,
}


def barrier(tag: str = "nb_accel.wait_for_everyone") -> None:
    """Block until every rank reaches the barrier (``tag`` names it for the reader; XLA
    matches collectives by their order)."""
    mark_step()
    xm.all_reduce(xm.REDUCE_SUM, torch.zeros(1).to(xla_device())).cpu()


def _cpu_tree(obj: Any) -> Any:
    return recursively_apply(lambda t: t.detach().cpu(), obj, test_type=is_xla_tensor)


def _gather_rows(row: torch.Tensor) -> torch.Tensor:
    """Every rank's 1-D CPU ``row`` (all of one length), concatenated, on the CPU.

    The row goes to the device as data (never as a constant) and the layout is left free: the
    graph is the same on every rank, so ranks that share a process (one thread each) match it.
    """
    return xm.all_gather(row.to(xla_device()), dim=0, pin_layout=False).cpu()


def exchange_objects(obj: Any, tag: str) -> list[Any]:
    """Every rank's picklable ``obj``, in rank order (a collective: every rank calls it).

    ``tag`` names the exchange for the reader; XLA matches collectives by their order.
    """
    payload = pickle.dumps(_cpu_tree(obj), protocol=pickle.HIGHEST_PROTOCOL)
    if len(payload) >= 1 << 31:
        raise ValueError(
            f"{tag}: the object pickles to {len(payload)} bytes, more than an XLA collective "
            "carries (2 GiB); send tensors with gather() or broadcast() instead"
        )
    mark_step()  # the pending graph runs on its own; the exchange is a graph of its own
    sizes = _gather_rows(torch.tensor([len(payload)], dtype=torch.int32)).tolist()
    rows = _gather_rows(pack_row(payload, row_width(max(sizes))))
    return [pickle.loads(data) for data in unpack_rows(rows, sizes)]


def _on_xla(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.device.type == "xla" else tensor.to(xla_device())


def _back(result: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return result if like.device.type == "xla" else result.to(like.device)


def _gather_one(tensor: torch.Tensor) -> torch.Tensor:
    rows = tensor.clone()[None] if tensor.dim() == 0 else tensor.contiguous()
    return _back(xm.all_gather(_on_xla(rows), dim=0), tensor)


def gather(tensor: Any) -> Any:
    """Every rank's tensors concatenated along the first dimension (0-d: one row per rank).

    Every rank must pass tensors of the same shapes (use ``pad_across_processes`` first).
    """
    return recursively_apply(_gather_one, tensor, error_on_other_type=True)


def gather_object(obj: Any) -> Any:
    """Every rank's object; one flat list when every rank passes a list or tuple."""
    output = exchange_objects(obj, "nb_accel.gather_object")
    if all(isinstance(item, (list, tuple)) for item in output):
        return [x for item in output for x in item]
    return output


def reduce(tensor: Any, reduction: str = "mean", scale: float = 1.0) -> Any:
    """Reduced copies of a tree of tensors (``"mean"``, ``"sum"``, ``"max"``, ``"min"``,
    ``"none"``: summed), multiplied by ``scale``; every rank gets the result."""
    op = _REDUCE_OPS[reduction]
    world = world_size()

    def _reduce(one: torch.Tensor) -> torch.Tensor:
        result = xm.all_reduce(op, _on_xla(one.clone()))
        if reduction == "mean" and world > 1:
            result = result / world
        if scale != 1.0:
            result = result * scale
        return _back(result, one)

    return recursively_apply(_reduce, tensor, error_on_other_type=True)


def broadcast(tensor: Any, from_process: int = 0) -> Any:
    """Rank ``from_process``'s tensors on every rank, written into the given tensors."""

    def _broadcast(one: torch.Tensor) -> torch.Tensor:
        if one.device.type == "xla":
            xm.collective_broadcast([one], root_ordinal=from_process)
            return one
        moved = one.to(xla_device())
        xm.collective_broadcast([moved], root_ordinal=from_process)
        one.copy_(moved.to(one.device))
        return one

    result = recursively_apply(_broadcast, tensor, error_on_other_type=True)
    mark_step()
    return result


def broadcast_object_list(object_list: list[Any], from_process: int = 0) -> list[Any]:
    """Replace the items of ``object_list`` in place with rank ``from_process``'s items."""
    mine = object_list if global_ordinal() == from_process else None
    sent = exchange_objects(mine, "nb_accel.broadcast_object_list")[from_process]
    object_list[:] = sent
    return object_list


def largest_sizes(sizes: list[int]) -> list[int]:
    """The element-wise maximum of every rank's ``sizes`` (lists of equal length)."""
    everyone = exchange_objects(sizes, "nb_accel.pad_across_processes")
    return [max(column) for column in zip(*everyone, strict=True)] if sizes else []
