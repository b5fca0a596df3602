"""Tensor parallelism as ``prepare()`` takes it: a model already parallelised over the ``tp``
dimension of the mesh (by ``parallelize_module``, or by ``transformers``' ``tp_plan="auto"``),
checked against the configuration, its other parameters made the same on every rank; and how
many consecutive ranks of a mesh share batches, as the loaders are sharded over the
data-parallel ranks only."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "any_dtensor",
    "get_model_tp_size",
    "has_dtensor_parameters",
    "check_tensor_parallel",
    "mesh_group_size",
    "quiet_redistribution",
    "replicate_plain_parameters",
]

#: torch's logger that suggests flattening a mesh's dimensions when a DTensor on two of them
#: is made whole in two collectives (a gradient norm, a whole state dict).
_REDISTRIBUTE_LOGGER = "torch.distributed.tensor._redistribute"


def any_dtensor(tensors: Iterable[torch.Tensor | None]) -> bool:
    """True when one of ``tensors`` is a ``DTensor`` (spread over ranks)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(t, DTensor) for t in tensors)


def has_dtensor_parameters(model: torch.nn.Module) -> bool:
    """True when some parameter of ``model`` is a ``DTensor`` (tensor parallel, or sharded)."""
    return any_dtensor(model.parameters())


def get_model_tp_size(model: torch.nn.Module) -> int | None:
    """The tensor parallel degree ``model`` was parallelised with, or ``None``: what
    ``transformers`` records (``model.tp_size``, or its config's ``distributed_config``), else
    the size of the mesh its ``DTensor`` parameters are spread over."""
    recorded = getattr(model, "tp_size", None)
    if recorded is None:
        distributed = getattr(getattr(model, "config", None), "distributed_config", None)
        if isinstance(distributed, dict):
            recorded = distributed.get("tp_size")
        else:
            recorded = getattr(distributed, "tp_size", None)
    if recorded is not None:
        return int(recorded)
    from torch.distributed.tensor import DTensor

    sizes = {p.device_mesh.size() for p in model.parameters() if isinstance(p, DTensor)}
    return max(sizes) if sizes else None


def check_tensor_parallel(model: torch.nn.Module, tp_size: int) -> None:
    """Refuse ``model`` when it is not parallelised over a ``tp`` dimension of ``tp_size``
    ranks (before anything is wrapped)."""
    found = get_model_tp_size(model)
    name = type(model).__name__
    if found is None or not has_dtensor_parameters(model):
        raise ValueError(
            f"ParallelismConfig(tp_size={tp_size}), but {name} is not tensor parallel: none of "
            "its parameters is spread over the 'tp' dimension. Parallelise it before "
            "prepare(): parallelize_module(model, accelerator.torch_device_mesh['tp'], plan) "
            "with torch's ColwiseParallel/RowwiseParallel plan, or from_pretrained(..., "
            "tp_plan='auto') for a transformers model that has one; or leave tp_size at 1"
        )
    if found != tp_size:
        raise ValueError(
            f"tp_size in the ParallelismConfig ({tp_size}) should be the same as the model's tp "
            f"size ({found}): {name} was parallelised over {found} ranks. Parallelise it over "
            "accelerator.torch_device_mesh['tp'], or make tp_size match"
        )


def replicate_plain_parameters(model: torch.nn.Module) -> None:
    """Give every rank the main process's values of ``model``'s parameters and buffers that
    are not ``DTensor``s (a tensor parallel model's replicated layers: embeddings, norms), as
    DistributedDataParallel does for a whole model; the ``DTensor`` ones already hold their
    part of the first rank's values."""
    from torch.distributed.tensor import DTensor

    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if not isinstance(tensor, DTensor):
                dist.broadcast(tensor.data, src=0)


def mesh_group_size(mesh: Any) -> int:
    """How many consecutive ranks of ``mesh`` (Accelerate's device mesh) share batches: the
    product of its ``tp`` and ``cp`` dimensions."""
    names = getattr(mesh, "mesh_dim_names", None) or ()
    size = 1
    for name in ("tp", "cp"):
        if name in names:
            size *= int(mesh[name].size())
    return size


@contextlib.contextmanager
def quiet_redistribution() -> Iterator[None]:
    """Inside the block, torch does not suggest flattening the mesh's dimensions when nb_accel
    makes a tensor parallel and sharded ``DTensor`` whole (the clipping norm, whole weights):
    the mesh is Accelerate's layout, which the user does not choose there, and the extra
    collective is one per call."""
    logger = logging.getLogger(_REDISTRIBUTE_LOGGER)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
