"""Collectives on tensor trees across the processes of a launch.

Every function is the identity (``reduce``: a copy) when the launch has a single process, so the
same code runs with one process or many. Trees are nested lists, tuples and dicts of tensors.
The worker's device backend (:mod:`~nb_accel.runtime.device_backends`) runs the collectives.
Tensors may be on any device: one the backend cannot run on (a CPU tensor under NCCL) goes to
the rank's device for the collective, and results come back on the caller's tensor's device.
Shapes are checked across processes in debug mode only (see
:mod:`~nb_accel.runtime.device_backends.shape_checks`).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch

from ..device_backends.base import DeviceBackend, leaves
from ..device_backends.shape_checks import DistributedOperationException, debug_mode
from ..state import GradientState, PartialState
from ..tree import concatenate, find_device, has_only_tensors, recursively_apply, send_to_device

__all__ = [
    "DistributedOperationException",
    "REDUCTIONS",
    "gather",
    "gather_object",
    "gather_object_among",
    "reduce",
    "broadcast",
    "broadcast_object_list",
    "pad_across_processes",
    "gather_for_metrics",
]

#: Reductions accepted by :func:`reduce` ("none" sums without averaging, as in Accelerate).
REDUCTIONS = ("mean", "sum", "max", "min", "none")


def _state() -> PartialState:
    return PartialState()


def _backend() -> DeviceBackend:
    """The device backend of this rank's state, which runs the collectives."""
    return _state().device_backend


def gather(tensor: Any) -> Any:
    """Gather a tree of tensors from every process, concatenated along the first dimension.

    A 0-d tensor becomes one row per process; results are on the device of the tensors passed.
    Every process must pass tensors of the same shapes (use :func:`pad_across_processes`
    first). In debug mode (``ACCELERATE_DEBUG_MODE=1``) this is checked, at the cost of one
    more collective, and every process raises :class:`DistributedOperationException` when they
    differ; otherwise mismatched shapes fail in the backend (see
    :mod:`~nb_accel.runtime.device_backends.shape_checks`).
    Identity on a single process.
    """
    return _backend().gather(tensor)


def gather_object(object: Any) -> Any:
    """Gather any picklable object from every process.

    When every process passes a list or tuple, the result is one flat list of their items in
    process order (as in Accelerate); otherwise it is the list of the processes' objects.
    Identity on a single process.
    """
    return _backend().gather_object(object)


def gather_object_among(obj: Any, ranks: Sequence[int]) -> list[Any]:
    """The objects of the processes in ``ranks`` (this one included), in rank order.

    Only those processes take part: the others may be elsewhere (for example past the end of
    a data loader that gave them fewer batches). Point-to-point messages go through the lowest
    rank. On a single process, or when ``ranks`` is only this process, ``[obj]``.
    """
    members = sorted(set(ranks))
    me = _state().process_index
    if me not in members:
        raise ValueError(f"process {me} is not among the ranks {members} it gathers from")
    backend = _backend()
    if not backend.collectives_active or members == [me]:
        return [obj]
    return backend.gather_object_among(obj, members)


def reduce(tensor: Any, reduction: str = "mean", scale: float = 1.0) -> Any:
    """Reduce a tree of tensors across processes; every process gets the result.

    Args:
        tensor: tensors, possibly nested in lists, tuples and dicts (inputs are not modified).
        reduction: ``"mean"`` (the default, as in Accelerate), ``"sum"``, ``"max"``, ``"min"``,
            or ``"none"`` (summed but not averaged, as in Accelerate).
        scale: multiply the result by this factor.

    Returns:
        The same tree with reduced copies; on a single process, copies of the inputs.
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction={reduction!r} is not one of {REDUCTIONS}")
    return _backend().reduce(tensor, reduction, scale)


def broadcast(tensor: Any, from_process: int = 0) -> Any:
    """Send process ``from_process``'s tensors to every process, in place.

    Every process passes tensors of the same shapes and dtypes (their contents are
    overwritten; checked in debug mode, as in :func:`gather`). Returns the tree. Identity on a
    single process.
    """
    return _backend().broadcast(tensor, from_process)


def broadcast_object_list(object_list: list[Any], from_process: int = 0) -> list[Any]:
    """Replace the items of ``object_list`` in place with process ``from_process``'s items.

    Every process passes a list of the same length. Returns the same list.
    """
    return _backend().broadcast_object_list(object_list, from_process)


def _padded(
    tensor: torch.Tensor, dim: int, size: int, pad_index: Any, pad_first: bool
) -> torch.Tensor:
    if size <= tensor.shape[dim]:
        return tensor
    shape = list(tensor.shape)
    old = shape[dim]
    shape[dim] = size
    result = tensor.new_full(shape, pad_index)
    start = size - old if pad_first else 0
    result.narrow(dim, start, old).copy_(tensor)
    return result


def pad_across_processes(
    tensor: Any, dim: int = 0, pad_index: Any = 0, pad_first: bool = False
) -> Any:
    """Pad every tensor along ``dim`` to the largest size any process has, so it can be gathered.

    Args:
        tensor: tensors, possibly nested; every process passes the same structure.
        dim: the dimension to pad (tensors with fewer dimensions are left alone).
        pad_index: the value of the added entries.
        pad_first: pad at the start instead of the end.
    """
    backend = _backend()
    if not backend.collectives_active:
        return tensor
    found = leaves(tensor, "pad_across_processes")
    if debug_mode():  # every dimension but `dim`, and their number, must agree
        shapes = [[0 if i == dim else n for i, n in enumerate(one.shape)] for one in found]
        backend.check_shapes([torch.empty(shape) for shape in shapes], "pad_across_processes")

    def _size(one: torch.Tensor) -> int:
        if getattr(one, "is_nested", False):
            warnings.warn("pad_across_processes leaves nested tensors as they are", stacklevel=3)
            return -1
        return int(one.shape[dim]) if dim < one.dim() else -1

    sizes = torch.tensor([_size(one) for one in found], dtype=torch.int64)
    targets = iter(backend.largest_sizes(sizes))

    def _pad(one: torch.Tensor) -> torch.Tensor:
        size = next(targets)
        if size < 0 or dim >= one.dim():
            return one
        return _padded(one, dim, size, pad_index, pad_first)

    return recursively_apply(_pad, tensor, error_on_other_type=True)


#: What a process that holds no batch at an uneven step contributes to its gather.
_NO_BATCH = object()


def _gather_uneven(data: Any, ranks: Sequence[int], use_objects: bool, kind: str) -> Any:
    """Gather among ``ranks`` only, whose data may differ in size; nothing is repeated.

    ``data`` is ``_NO_BATCH`` on a process that holds no batch at this step (it only receives).
    ``kind`` names the step on every process, so calls out of step raise instead of mixing.
    """
    holds = data is not _NO_BATCH
    if holds and not use_objects:
        data = recursively_apply(lambda t: t.detach().cpu().reshape(t.shape or (1,)), data)
    pieces = gather_object_among((kind, holds, data if holds else None), ranks)
    if {piece[0] for piece in pieces} != {kind}:
        raise RuntimeError(
            f"process {_state().process_index}: gather_for_metrics was called out of step with "
            "the other processes at the end of a loader with even_batches=False: call it once "
            "per batch on every process (gather a tuple of everything you need at once)"
        )
    held = [piece[2] for piece in pieces if piece[1]]
    if use_objects:
        if all(isinstance(piece, (list, tuple)) for piece in held):
            return [x for piece in held for x in piece]
        return held
    return concatenate(held)


def _joined_results(first: Any, then: Any, use_objects: bool) -> Any:
    """This process's last gathered step followed by the step it held no batch for."""
    if use_objects:
        return list(first) + list(then)
    device = find_device(first)
    return concatenate([first, then if device is None else send_to_device(then, device)])


def _once_per_group(data: Any, use_objects: bool, num_processes: int, group: int) -> Any:
    """Every process's ``data`` gathered, but only the first of each run of ``group`` ranks
    that shared a batch."""
    if use_objects:
        shared = isinstance(data, (list, tuple))
        mine = data if _state().process_index % group == 0 else type(data)() if shared else data
        gathered = gather_object(mine)
        return gathered if shared else gathered[::group]

    def first_of_groups(tensor: torch.Tensor) -> torch.Tensor:
        rows = tensor.reshape(num_processes, -1, *tensor.shape[1:])[::group]
        return rows.reshape(-1, *tensor.shape[1:])

    return recursively_apply(first_of_groups, gather(data))


def gather_for_metrics(
    data: Any,
    gradient_state: GradientState,
    num_processes: int,
    use_gather_object: bool = False,
    ranks_per_batch: int = 1,
) -> Any:
    """Gather evaluation results for metrics: exactly the dataset's samples, none repeated.

    Like :func:`gather` (or :func:`gather_object` for data that is not only tensors, or with
    ``use_gather_object``), then, at the last batch of the active prepared loader, drops the
    samples it repeated to give every process an equal last batch (using its ``remainder``).
    With uneven loaders (``even_batches=False``) the processes that hold a batch at this step
    exchange their data of whatever size; a process that holds none at the last step also
    receives that step's data in its own last call, so every process ends with every sample
    (call it once per batch there: the calls of the last two steps are paired).

    Args:
        data: this process's results for the current batch.
        gradient_state: the shared :class:`GradientState` (knows the active loader).
        num_processes: processes in the launch (identity when 1).
        use_gather_object: gather as Python objects even when ``data`` is only tensors.
        ranks_per_batch: how many consecutive ranks shared each batch (a tensor parallel
            group): the first one's results are kept, the others' are the same samples.
    """
    use_objects = use_gather_object or not has_only_tensors(data)
    if num_processes <= 1:
        return data
    loader = gradient_state.active_dataloader
    holders = getattr(loader, "uneven_ranks", None)
    tail_follows = bool(getattr(loader, "tail_follows", False))
    if holders is not None or tail_follows:
        everyone = tuple(range(num_processes))
        members = getattr(loader, "gather_ranks", None) or holders or everyone
        kind = "last" if tail_follows else "tail" if len(members) > len(holders or ()) else "step"
        device = find_device(data)
        gathered = _gather_uneven(data, members, use_objects, kind)
        if device is not None and not use_objects:
            gathered = send_to_device(gathered, device)
        if getattr(loader, "trailing_ranks", None):  # the others' last step, held by them only
            rest = _gather_uneven(_NO_BATCH, everyone, use_objects, "tail")
            gathered = _joined_results(gathered, rest, use_objects)
        return gathered
    if ranks_per_batch > 1:
        gathered = _once_per_group(data, use_objects, num_processes, ranks_per_batch)
    else:
        gathered = gather_object(data) if use_objects else gather(data)
    if not gradient_state.end_of_dataloader or not getattr(loader, "even_batches", True):
        return gathered
    remainder = gradient_state.remainder
    if remainder <= 0:
        return gathered
    if use_objects:
        return gathered[:remainder] if isinstance(gathered, list) else gathered
    return recursively_apply(lambda t: t[:remainder], gathered)
