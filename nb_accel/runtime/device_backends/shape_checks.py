"""Debug mode for collectives: check that every process passes tensors of the same shapes.

The check is one more collective (and, on a GPU, one wait of the CPU for the GPU) per call, so
it runs only in debug mode, as in Accelerate: set ``ACCELERATE_DEBUG_MODE=1`` in the
environment the processes start with (or before the first collective in the function). Without
it, processes that pass tensors of different shapes to ``gather``, ``broadcast`` or ``reduce``
get the backend's own failure: gloo aborts a process, NCCL may hang until the launch's timeout
or return wrong data. With it, every process raises :class:`DistributedOperationException`
naming the sizes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

from ..._flags import env_flag
from .placement import all_gather_rows

__all__ = [
    "DEBUG_VARIABLE",
    "DistributedOperationException",
    "check_same_shapes",
    "debug_mode",
    "set_debug_mode",
]

#: The environment variable that turns debug mode on (Accelerate's name).
DEBUG_VARIABLE = "ACCELERATE_DEBUG_MODE"
#: What ``PartialState.debug = ...`` set in this process (``None``: follow the variable).
_chosen: list[bool | None] = [None]


class DistributedOperationException(ValueError):
    """A collective cannot run as asked: the processes passed incompatible tensors."""


def set_debug_mode(enabled: bool | None) -> None:
    """Turn debug mode on or off in this process (``None``: follow ``ACCELERATE_DEBUG_MODE``)."""
    _chosen[0] = None if enabled is None else bool(enabled)


def debug_mode() -> bool:
    """True when debug mode was turned on in this process (``PartialState().debug = True``) or,
    unless it was turned off, when ``ACCELERATE_DEBUG_MODE`` is set to a true value (``1``,
    ``true``, ``yes``...)."""
    if _chosen[0] is not None:
        return _chosen[0]
    hint = "set it to 1 (debug mode: collectives check shapes) or 0"
    return bool(env_flag(DEBUG_VARIABLE, default=False, hint=hint))


def _digest(leaves: Sequence[torch.Tensor]) -> int:
    signature = repr([(tuple(t.shape), str(t.dtype)) for t in leaves]).encode()
    return int.from_bytes(hashlib.blake2b(signature, digest_size=7).digest(), "little")


def check_same_shapes(
    leaves: Sequence[torch.Tensor],
    operation: str,
    backend: str | None,
    device: torch.device,
    world: int,
) -> None:
    """Raise the same :class:`DistributedOperationException` on every process when the
    processes' tensors differ in structure, shape or dtype (one collective)."""
    first = int(leaves[0].shape[0]) if leaves and leaves[0].dim() > 0 else -1
    summary = torch.tensor([_digest(leaves), first, len(leaves)], dtype=torch.int64)
    rows = all_gather_rows(summary, backend, device, world)
    if len({int(row[0]) for row in rows}) == 1:
        return
    hint = {
        "gather": "call pad_across_processes(...) first, or use gather_for_metrics or "
        "gather_object",
        "pad_across_processes": "it pads one dimension: the others, and how many there are, "
        "must be the same on every process",
    }.get(operation, "pass tensors of the same shapes and dtypes on every process")
    firsts = {rank: int(row[1]) for rank, row in enumerate(rows)}
    if len(set(firsts.values())) > 1:
        raise DistributedOperationException(
            f"{operation} needs tensors of the same size on every process, but their first "
            f"dimensions differ (process: size) {firsts}; {hint}"
        )
    raise DistributedOperationException(
        f"{operation} needs the same structure, shapes and dtypes on every process, but they "
        f"differ; {hint}"
    )
