"""Sharded gradients: skipping the reduce-scatter while accumulating, and clipping by the norm
of the whole (sharded) gradient."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from ..parallelism.tensor import quiet_redistribution

__all__ = ["clip_sharded_grad_norm_", "gradient_sync"]


@contextlib.contextmanager
def gradient_sync(model: torch.nn.Module, enabled: bool) -> Iterator[None]:
    """Inside the block, backward passes of the sharded ``model`` reduce-scatter their
    gradients (``enabled``) or keep accumulating them unreduced on each process; the setting
    before the block comes back after it."""
    before = getattr(model, "_nb_accel_gradient_sync", True)
    model.set_requires_gradient_sync(enabled)  # type: ignore[operator]
    model.__dict__["_nb_accel_gradient_sync"] = enabled
    try:
        yield
    finally:
        model.set_requires_gradient_sync(before)  # type: ignore[operator]
        model.__dict__["_nb_accel_gradient_sync"] = before


def _local_norm(grads: list[torch.Tensor], norm_type: float) -> torch.Tensor:
    if not grads:
        return torch.zeros((), dtype=torch.float32)
    norms = torch.stack([torch.linalg.vector_norm(g.float(), norm_type).cpu() for g in grads])
    return torch.linalg.vector_norm(norms, norm_type)


def clip_sharded_grad_norm_(
    parameters: torch.Tensor | Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0
) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` for a mix of sharded (``DTensor``) gradients and plain
    ones (of ignored modules, the same on every process): the norm is that of the whole
    gradient, the same on every process, returned as a plain tensor."""
    from torch.distributed.tensor import DTensor

    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    norm_type = float(norm_type)
    sharded = [g for g in grads if isinstance(g, DTensor)]
    plain = [g for g in grads if not isinstance(g, DTensor)]
    parts: list[torch.Tensor] = []
    by_mesh: dict[Any, list[torch.Tensor]] = {}
    for piece in sharded:  # tensor parallel layers under FSDP2 lie on a mesh of their own
        by_mesh.setdefault(piece.device_mesh, []).append(piece)
    for group in by_mesh.values():  # torch's norm of the whole DTensors: a reduction each
        with quiet_redistribution():
            norm = torch.nn.utils.get_total_norm(group, norm_type)
            whole = norm.full_tensor() if isinstance(norm, DTensor) else norm
        parts.append(whole.float().cpu())
    if plain:
        parts.append(_local_norm(plain, norm_type))
    if not parts:
        return torch.zeros(())
    total_norm = torch.linalg.vector_norm(torch.stack([p.reshape(()) for p in parts]), norm_type)
    coefficient = float(max_norm) / (float(total_norm) + 1e-6)
    if coefficient < 1 and math.isfinite(coefficient):
        for grad in grads:
            grad.mul_(coefficient)
    return total_norm
