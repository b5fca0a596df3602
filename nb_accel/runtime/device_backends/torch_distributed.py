"""The default device backend: torch.distributed's process group (gloo on the CPU, NCCL on GPUs).

Collectives are identities while a single process runs or no group is up. Tensors may be on
any device: one the group's backend cannot run on (a CPU tensor under NCCL) goes to the rank's
device for the collective, and results come back on the caller's tensor's device.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from ..._flags import env_flag
from ..device_types import process_device_type, rank_device_type
from ..device_types.group_backends import backend_for, offload_asked_by_environment
from ..enums import DistributedType
from ..tree import recursively_apply
from .base import DeviceBackend
from .placement import all_gather_rows, move_target

__all__ = ["TorchDistributedBackend"]


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def _offload_asked(options: dict[str, Any]) -> bool:
    """True when the state is made for FSDP with CPU offload: the ``Accelerator``'s plugin says
    so, or, as Accelerate reads it, ``ACCELERATE_USE_FSDP`` and ``FSDP_OFFLOAD_PARAMS``."""
    if getattr(options.get("fsdp_plugin"), "offloads_to_cpu", False):
        return True
    return bool(env_flag("ACCELERATE_USE_FSDP", False)) and offload_asked_by_environment()


class TorchDistributedBackend(DeviceBackend):
    """torch.distributed: ranks from the environment (``torchrun``'s variables, or the group
    nb_accel's worker created), collectives through the default process group.

    Args:
        rank: the state it serves.
    """

    title = "torch.distributed"

    def rank_fields(self, cpu: bool, options: dict[str, Any]) -> dict[str, Any]:
        """Ranks and device from the environment. Under ``torchrun`` (the environment names a
        world but no group exists yet) it creates the process group, with ``options``'s
        ``backend``, ``init_method`` and ``timeout``; without a ``backend`` there, NCCL on GPUs
        (with gloo for CPU tensors beside it when FSDP offloads to the CPU) and gloo on the
        CPU."""
        backend = os.environ.get("NB_ACCEL_BACKEND")
        world_size = _env_int("WORLD_SIZE", 1)
        if dist.is_available() and dist.is_initialized():
            world_size = dist.get_world_size()
            backend = dist.get_backend()
        elif world_size > 1 and dist.is_available():  # under torchrun: InitProcessGroupKwargs
            group = {k: v for k, v in options.items() if k in ("init_method", "timeout")}
            backend = (
                backend
                or options.get("backend")
                or process_device_type(cpu).group_backend(_offload_asked(options))
            )
            dist.init_process_group(backend=backend, **group)
        local_index = _env_int("LOCAL_RANK", 0)
        device = rank_device_type(backend, world_size, cpu)
        kind = DistributedType.NO if world_size == 1 else device.distributed_type
        return {
            "backend": backend if world_size > 1 else None,
            "num_processes": world_size,
            "process_index": dist.get_rank() if dist.is_initialized() else 0,
            "local_process_index": local_index,
            "num_local_processes": _env_int("LOCAL_WORLD_SIZE", world_size),
            "device": device.rank_device(local_index),
            "device_type": device,
            "distributed_type": kind,
        }

    def barrier(self) -> None:
        """``dist.barrier()`` when more than one process takes part."""
        if self.rank.num_processes > 1 and dist.is_initialized():
            dist.barrier()

    @property
    def collectives_active(self) -> bool:
        """True when more than one process takes part and the group is up."""
        return self.rank.num_processes > 1 and dist.is_available() and dist.is_initialized()

    def _all_gather_rows(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        rank = self.rank
        return all_gather_rows(tensor, rank.backend, rank.device, rank.num_processes)

    def _to_collective_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` where this launch's backend can run a collective on it (often itself)."""
        target = move_target(tensor.device, self.rank.backend, self.rank.device)
        return tensor if target is None else tensor.to(target)

    def _gather_one(self, one: torch.Tensor) -> torch.Tensor:
        tensor = self._to_collective_device(one[None] if one.dim() == 0 else one).contiguous()
        world = self.rank.num_processes
        if backend_for(self.rank.backend, tensor.device.type) == "nccl":
            output = torch.empty(
                (world * tensor.shape[0], *tensor.shape[1:]),
                dtype=tensor.dtype,
                device=tensor.device,
            )
            dist.all_gather_into_tensor(output, tensor)
        else:
            parts = [torch.empty_like(tensor) for _ in range(world)]
            dist.all_gather(parts, tensor)
            output = torch.cat(parts, dim=0)
        return output.to(one.device)

    def gather(self, tree: Any) -> Any:
        """``all_gather`` of each tensor (``all_gather_into_tensor`` under NCCL)."""
        if not self.collectives_active:
            return tree
        self.check_shapes(tree, "gather")
        return recursively_apply(self._gather_one, tree, error_on_other_type=True)

    def gather_object(self, obj: Any) -> Any:
        """``all_gather_object``."""
        if not self.collectives_active:
            return obj
        output: list[Any] = [None] * self.rank.num_processes
        dist.all_gather_object(output, obj)
        if all(isinstance(item, (list, tuple)) for item in output):
            return [x for item in output for x in item]
        return output

    def gather_object_among(self, obj: Any, members: list[int]) -> list[Any]:
        """``all_gather_object`` when every rank takes part; otherwise point-to-point messages
        through the lowest rank of ``members``."""
        if len(members) == self.rank.num_processes:
            output: list[Any] = [None] * len(members)
            dist.all_gather_object(output, obj)
            return output
        root = members[0]
        if self.rank.process_index != root:
            dist.send_object_list([obj], dst=root)
            box: list[Any] = [None]
            dist.recv_object_list(box, src=root)
            return list(box[0])
        collected = [obj]
        for rank in members[1:]:
            box = [None]
            dist.recv_object_list(box, src=rank)
            collected.append(box[0])
        for rank in members[1:]:
            dist.send_object_list([collected], dst=rank)
        return collected

    def reduce(self, tree: Any, reduction: str, scale: float) -> Any:
        """``all_reduce`` of a copy of each tensor (summed for ``"mean"``, then divided)."""
        op = {"max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}.get(reduction, dist.ReduceOp.SUM)
        distributed = self.collectives_active
        world = self.rank.num_processes
        if distributed:
            self.check_shapes(tree, "reduce")

        def _reduce(one: torch.Tensor) -> torch.Tensor:
            result = one.clone()
            if distributed:
                moved = self._to_collective_device(result)
                dist.all_reduce(moved, op=op)
                result = moved.to(one.device)
            if reduction == "mean":
                result = result / world if world > 1 else result
            return result * scale if scale != 1.0 else result

        return recursively_apply(_reduce, tree, error_on_other_type=True)

    def broadcast(self, tree: Any, from_process: int) -> Any:
        """``dist.broadcast`` into each tensor."""
        if not self.collectives_active:
            return tree
        self.check_shapes(tree, "broadcast")

        def _broadcast(one: torch.Tensor) -> torch.Tensor:
            target = self._to_collective_device(one).contiguous()
            dist.broadcast(target, src=from_process)
            if target is not one:
                one.copy_(target)
            return one

        return recursively_apply(_broadcast, tree, error_on_other_type=True)

    def broadcast_object_list(self, object_list: list[Any], from_process: int) -> list[Any]:
        """``dist.broadcast_object_list``."""
        if self.collectives_active:
            dist.broadcast_object_list(object_list, src=from_process)
        return object_list

    def largest_sizes(self, sizes: torch.Tensor) -> list[int]:
        """Every rank's ``sizes`` gathered, then the maximum of each column."""
        if not len(sizes):
            return []
        return [int(n) for n in torch.stack(self._all_gather_rows(sizes)).amax(dim=0).tolist()]
