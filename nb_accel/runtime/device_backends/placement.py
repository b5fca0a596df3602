"""Where a collective's tensors must be: NCCL runs only on the rank's GPU, gloo on the CPU.

A tensor on a device its process group's backend cannot serve (a CPU tensor under NCCL, a
CUDA tensor under gloo, a tensor on another GPU than the rank's) is moved to the rank's device
for the collective, and the result comes back to the device the caller's tensor was on.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..device_types.group_backends import backends_by_device

__all__ = ["served_device_types", "move_target", "all_gather_rows"]


def served_device_types(backend: str) -> set[str]:
    """The device types a process group's backend runs collectives on.

    ``"nccl"`` gives ``{"cuda"}``, ``"gloo"`` ``{"cpu"}``, and a per-device backend string such
    as ``"cpu:gloo,cuda:nccl"`` ``{"cpu", "cuda"}``; an unknown backend gives an empty set.
    """
    return set(backends_by_device(backend))


def move_target(
    tensor_device: torch.device, backend: str | None, device: torch.device
) -> torch.device | None:
    """The device to move a tensor to before a collective, or ``None`` to leave it where it is.

    Args:
        tensor_device: where the caller's tensor is.
        backend: the process group's backend (``None`` on a single process).
        device: this rank's device (``cuda:<local rank>`` under NCCL, the CPU under gloo).

    A tensor moves to ``device`` when the backend cannot run on its device type, or when it is
    on another device of the rank's type (another GPU than the rank's). Nothing moves for an
    unknown backend or one that cannot run on ``device`` either.
    """
    if backend is None or tensor_device == device:
        return None
    served = served_device_types(backend)
    if device.type not in served:
        return None
    if tensor_device.type in served and tensor_device.type != device.type:
        return None
    return device


def all_gather_rows(
    tensor: torch.Tensor, backend: str | None, device: torch.device, world: int
) -> list[torch.Tensor]:
    """Every process's copy of a small bookkeeping ``tensor`` (sizes, digests), on the CPU."""
    target = move_target(tensor.device, backend, device)
    if target is not None:
        tensor = tensor.to(target)
    rows = [torch.empty_like(tensor) for _ in range(world)]
    dist.all_gather(rows, tensor)
    return [row.cpu() for row in rows]
