"""Sharding a model with FSDP2: ``fully_shard`` on each unit the wrap policy chose, then on the
model, after which every process holds 1/N of each parameter (a ``DTensor``)."""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist

from ..device_types.group_backends import backend_for
from ..parallelism.tensor import quiet_redistribution
from .activations import checkpoint_units
from .notices import say_no_effect
from .plugin import FullyShardedDataParallelPlugin
from .wrap_policy import ignored_modules, wrapped_modules

__all__ = ["ShardedModel", "is_fsdp_module", "shard_model"]


def is_fsdp_module(model: Any) -> bool:
    """True for a module sharded with ``fully_shard`` (FSDP2)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


class ShardedModel:
    """What sharding one model changed: its parameters before and after, by name, so that an
    optimizer built over the original parameters can be moved onto the shards."""

    def __init__(self, model: torch.nn.Module, before: dict[str, torch.nn.Parameter]) -> None:
        import weakref

        self.model = model
        after = dict(model.named_parameters())
        # weak references: the original full-size parameters must not be kept alive by us
        self._replaced = {
            id(old): (weakref.ref(old), after[name])
            for name, old in before.items()
            if name in after and after[name] is not old
        }

    def sharded(self, parameter: torch.nn.Parameter) -> torch.nn.Parameter | None:
        """The shard that replaced ``parameter``, or None if it is not one this model had."""
        entry = self._replaced.get(id(parameter))
        if entry is None or entry[0]() is not parameter:
            return None
        return entry[1]


def _check_cpu_collectives() -> None:
    """Refuse CPU offload on a process group that cannot run collectives on CPU tensors: the
    shards' norm, rank 0's weights broadcast into them and whole state dicts are such
    collectives, and torch runs them on the default group (there is no other to give them)."""
    backend = str(dist.get_backend())
    if backend_for(backend, "cpu") is not None:
        return
    raise ValueError(
        f"cpu_offload=True needs a process group that also reduces CPU tensors, and this "
        f"launch's group runs {backend!r} only (made before the function started, when the "
        "launch could not know the plugin would offload). Launch with FSDP: "
        "notebook_launcher(..., fsdp=True), %%distributed --fsdp or the saved sharding: fsdp "
        "(its group on GPUs is 'cuda:nccl,cpu:gloo'), or set FSDP_OFFLOAD_PARAMS=true in the "
        "kernel before launching; under torchrun, "
        "InitProcessGroupKwargs(backend='cuda:nccl,cpu:gloo')"
    )


def _offload_policy(plugin: FullyShardedDataParallelPlugin, device: torch.device) -> Any:
    """torch's ``CPUOffloadPolicy`` when the plugin offloads on an accelerator, else the
    policy that keeps the shards on the device."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

    if not plugin.offloads_to_cpu:
        return OffloadPolicy()
    if device.type == "cpu":
        say_no_effect("cpu_offload", "this launch runs on the CPU, where the shards are already", 4)
        return OffloadPolicy()
    _check_cpu_collectives()
    offload = plugin.cpu_offload
    return offload if isinstance(offload, CPUOffloadPolicy) else CPUOffloadPolicy()


def _wrap_error(name: str, module: torch.nn.Module, error: Exception) -> ValueError:
    where = f"submodule {name!r}" if name else "the model"
    return ValueError(
        f"FSDP cannot shard {where} ({type(module).__name__}): {error}. Leave it out with "
        "FullyShardedDataParallelPlugin(ignored_modules=[...]) or choose other units with "
        "auto_wrap_policy"
    )


def _check_dtypes(units: list[tuple[str, torch.nn.Module]], ignored: set[Any]) -> None:
    """Each unit's own parameters (not those of a unit below, nor ignored ones) are gathered as
    one tensor, so they must share one dtype: say which unit mixes them, before any sharding."""
    taken = set(ignored)
    for name, module in units:
        own = [p for p in module.parameters() if p not in taken]
        taken.update(own)
        dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in own})
        if len(dtypes) > 1:
            where = f"submodule {name!r}" if name else "the model"
            raise ValueError(
                f"FSDP cannot shard {where} ({type(module).__name__}): its parameters have "
                f"different dtypes ({', '.join(dtypes)}), and FSDP gathers a unit's parameters "
                "as one tensor. Give them one dtype (e.g. model.float()), make the differing "
                "layers units of their own with auto_wrap_policy, or leave them out with "
                "ignored_modules"
            )


def _whole_weights(model: torch.nn.Module, keep: bool) -> dict[str, Any]:
    """``model``'s whole weights on the CPU where ``keep`` (rank 0), else nothing; a tensor
    parallel ``DTensor`` is gathered whole first, which every rank takes part in."""
    from torch.distributed.tensor import DTensor

    whole: dict[str, Any] = {}
    for key, value in model.state_dict().items():
        with quiet_redistribution():
            full = value.full_tensor() if isinstance(value, DTensor) else value
        if keep:
            whole[key] = full.detach().cpu()
    return whole


def shard_model(
    model: torch.nn.Module,
    plugin: FullyShardedDataParallelPlugin,
    device: torch.device,
    mixed_precision: str,
    mesh: Any = None,
) -> ShardedModel:
    """Shard ``model`` in place across the default process group (across ``mesh``, when
    given: a 2-D mesh of replicas and shards makes HSDP).

    Every process ends up with rank 0's values (as DistributedDataParallel does), broadcast
    into the shards; with ``cpu_ram_efficient_loading`` only rank 0 needs real weights, the
    others may have built the model on the ``meta`` device.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if not any(True for _ in model.parameters()):
        raise ValueError(f"FSDP has nothing to shard: {type(model).__name__} has no parameters")
    ignored = ignored_modules(model, plugin)
    ignored_params = {p for module in ignored for p in module.parameters()}
    units = wrapped_modules(model, plugin, ignored)
    precision = copy.copy(plugin)  # the policy for this Accelerator's precision; plugin unchanged
    precision.set_mixed_precision(mixed_precision)
    rank0 = dist.get_rank() == 0
    on_meta = any(p.is_meta for p in model.parameters())
    if on_meta and rank0:
        raise ValueError(
            "the model's weights are on the meta device on the main process: with "
            "cpu_ram_efficient_loading only the other processes may build it on meta"
        )
    full = _whole_weights(model, rank0)
    _check_dtypes([*units, ("", model)], ignored_params)
    offload_policy = _offload_policy(plugin, device)  # before anything waits on the others
    if plugin.activation_checkpointing:
        units = checkpoint_units(model, units, bool(plugin.activation_checkpointing_offload))
    before = dict(model.named_parameters())  # after the wrappers, which rename parameters
    options: dict[str, Any] = {
        "mesh": mesh
        if mesh is not None
        else init_device_mesh(device.type, (dist.get_world_size(),)),
        "offload_policy": offload_policy,
    }
    if precision.mixed_precision_policy is not None:
        options["mp_policy"] = precision.mixed_precision_policy
    for name, module in [*units, ("", model)]:
        own = {p for p in module.parameters() if p in ignored_params}
        # the root's parameters stay gathered from forward to backward (torch's choice for the
        # root): its backward would gather them again at once
        resharding = bool(plugin.reshard_after_forward)
        reshard = resharding if name or not resharding else None
        try:
            fully_shard(
                module, reshard_after_forward=reshard, ignored_params=own or None, **options
            )
        except (ValueError, RuntimeError, AssertionError, NotImplementedError) as error:
            raise _wrap_error(name, module, error) from None
    if on_meta:  # the shards get memory here, and rank 0's values below
        from torch.distributed.fsdp import CPUOffloadPolicy

        offloaded = isinstance(options["offload_policy"], CPUOffloadPolicy)
        model.to_empty(device=torch.device("cpu") if offloaded else device)
    set_model_state_dict(
        model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    )
    return ShardedModel(model, before)
