"""Sharing a tensor that only one process has (Accelerate's ``copy_tensor_to_devices``)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..state import PartialState
from .ops import broadcast_object_list, gather_object


def copy_tensor_to_devices(tensor: torch.Tensor | None = None) -> torch.Tensor:
    """Give every process a copy of ``tensor``, which exactly one process passes (the others
    pass ``None``); unlike ``broadcast``, the others need not know its shape or dtype.

    Raises:
        ValueError: on every process, when no process or more than one passed a tensor.
    """
    state = PartialState()
    if state.num_processes == 1 or not dist.is_initialized():
        if tensor is None:
            raise ValueError(
                "copy_tensor_to_devices needs the tensor on one process; all passed None"
            )
        return tensor.to(state.device)
    owners = [rank for rank, has in enumerate(gather_object([tensor is not None])) if has]
    if len(owners) != 1:
        which = "no process" if not owners else f"processes {owners}"
        raise ValueError(
            f"copy_tensor_to_devices needs the tensor on exactly one process, but {which} "
            "passed one; pass None on every other process"
        )
    owner = owners[0]
    shape_and_dtype = [(tuple(tensor.shape), tensor.dtype) if tensor is not None else None]
    shape, dtype = broadcast_object_list(shape_and_dtype, from_process=owner)[0]
    if tensor is None:
        tensor = torch.empty(shape, dtype=dtype, device=state.device)
    else:
        tensor = tensor.to(state.device)
    dist.broadcast(tensor, src=owner)
    return tensor
