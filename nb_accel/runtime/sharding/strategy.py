"""The interface every sharding strategy implements: how prepared models are spread over the
processes of a launch, and what follows from it for their optimizers, their gradients, their
state dicts and the values a launched function may return.

A strategy object is chosen once, when the Accelerator's state is made, and the call sites ask
it (``AcceleratorState.sharding``) instead of testing which strategy runs. What a launch sets in
its workers' environment and shows in its title is asked of the strategy's class, by name.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..device_types import DeviceType
from ..enums import DistributedType

__all__ = ["ModelSetup", "ShardingStrategy"]


@dataclass
class ModelSetup:
    """What one Accelerator tells its strategy when it prepares a model or an optimizer.

    Attributes:
        device: this process's device.
        device_type: the kind of device it is (``runtime/device_types``).
        local_process_index: this process's index on its machine.
        distributed_type: the process's kind (``NO``, ``MULTI_CPU``, ``MULTI_GPU``, ...).
        mixed_precision: ``"no"``, ``"bf16"`` or ``"fp16"``.
        handlers: the Accelerator's ``kwargs_handlers`` by class name (each strategy picks its
            own, e.g. ``DistributedDataParallelKwargs``).
        optimizers: the optimizers this Accelerator prepared so far.
        changed: what wrapping changed, one record per model, kept by the Accelerator for the
            optimizers prepared after it.
        mesh: the device mesh a sharding strategy shards over (the ``ParallelismConfig``'s:
            two dimensions for HSDP); None: every process, along one dimension.
        tp_size: the ``ParallelismConfig``'s tensor parallel size: models come parallelised
            over that many ranks, and are replicated only across the data dimensions.
        cp_size: the ``ParallelismConfig``'s context parallel size: attention masks are left
            out of models' attention, which runs over sequences cut across that many ranks.
    """

    device: torch.device
    device_type: DeviceType
    local_process_index: int
    distributed_type: DistributedType
    mixed_precision: str
    handlers: dict[str, Any] = field(default_factory=dict)
    optimizers: list[Any] = field(default_factory=list)
    changed: list[Any] = field(default_factory=list)
    mesh: Any = None
    tp_size: int = 1
    cp_size: int = 1


class ShardingStrategy(abc.ABC):
    """How prepared models are spread over the processes: each process holding the whole model
    (data parallel), or each holding a shard of it. Implementations are small dataclasses,
    registered by :attr:`name` in ``runtime/sharding/registry.py``."""

    #: The name in the registry, in the launch plan and in the saved configuration.
    name: ClassVar[str]
    #: How the strategy is named to the user (launch title, notes).
    label: ClassVar[str]
    #: True when ``prepare()`` must take models before optimizers (the optimizers then follow
    #: what wrapping did to the models' parameters).
    models_first: ClassVar[bool] = False
    #: True when the model is moved to the device before it is wrapped (else wrapping puts
    #: the parameters where they belong).
    places_model: ClassVar[bool] = True
    #: True when its launches' process groups must run collectives on CPU tensors too, whatever
    #: the devices (FSDP's CPU offload: gloo beside NCCL on GPUs).
    cpu_collectives: ClassVar[bool] = False
    #: True when it shards over a ``torch.distributed`` process group, which the devices of the
    #: launch must offer (XLA's ranks run their collectives otherwise).
    needs_process_group: ClassVar[bool] = False

    # --- the launch side: asked of the class, in the kernel ---------------------------------

    @classmethod
    @abc.abstractmethod
    def worker_env(cls) -> dict[str, str]:
        """The environment that makes ``Accelerator()`` in a launch's workers (nb_accel's and
        Accelerate's) choose this strategy."""

    @classmethod
    def launch_title(cls, shards: int) -> str | None:
        """What a launch's title says about the strategy for ``shards`` ranks (None: nothing)."""
        del shards
        return None

    # --- the choice and the state ----------------------------------------------------------

    @classmethod
    @abc.abstractmethod
    def from_options(cls, options: Mapping[str, Any]) -> ShardingStrategy | None:
        """This strategy, when the Accelerator's sharding ``options`` (``fsdp_plugin``, ...)
        ask for it; None when they do not. ``options["sharding"]`` is the name of the strategy
        the launch named (None outside a launch): that one is asked first."""

    def distributed_type(self, kind: DistributedType) -> DistributedType:
        """What ``AcceleratorState.distributed_type`` reports under this strategy on a process
        of ``kind``."""
        return kind

    def runs_on(self, kind: DistributedType) -> bool:
        """True when this strategy prepares models on a process of ``kind`` (else they are
        prepared as data parallel, which on one process leaves them as they are)."""
        del kind
        return True

    # --- models and optimizers -------------------------------------------------------------

    @abc.abstractmethod
    def wraps(self, model: torch.nn.Module, setup: ModelSetup) -> bool:
        """True when :meth:`wrap_model` has something to do for ``model``."""

    def compiles_before_wrap(self, model: torch.nn.Module, fullgraph: bool) -> bool:
        """True when ``torch.compile`` must see ``model`` before it is wrapped rather than
        after (``fullgraph``: the compile options ask for one graph)."""
        del model, fullgraph
        return False

    @abc.abstractmethod
    def wrap_model(self, model: torch.nn.Module, setup: ModelSetup) -> torch.nn.Module:
        """``model`` wrapped (or changed in place) for this strategy."""

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, setup: ModelSetup) -> None:
        """Make ``optimizer`` update what the prepared models now hold (nothing to do when
        wrapping kept their parameters)."""
        del optimizer, setup

    @classmethod
    def unwrap(cls, model: torch.nn.Module) -> torch.nn.Module | None:
        """The model inside this strategy's wrapper ``model``; None when ``model`` is not one."""
        del model
        return None

    def joinable(self, model: Any) -> Any:
        """What torch's ``Join`` takes for ``model`` (prepared by this strategy) or ``model``."""
        return model

    # --- gradients -------------------------------------------------------------------------

    @classmethod
    @abc.abstractmethod
    def no_sync(cls, model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        """Inside the block, backward passes of ``model`` (compiled or not) keep their
        gradients on each process, unsynchronised; a no-op for a model it did not prepare."""

    @classmethod
    @abc.abstractmethod
    def sync_in_backward(cls, model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        """Inside the block, the next backward pass of ``model`` synchronises its gradients,
        even under :meth:`no_sync`; a no-op for a model it did not prepare."""

    def clip_grad_norm_(
        self, parameters: torch.Tensor | Iterable[torch.Tensor], max_norm: float, norm_type: float
    ) -> torch.Tensor | None:
        """Clip gradients this strategy holds in a form of its own (shards) by the norm of the
        whole gradient, and return that norm; None when every process holds whole gradients,
        which the Accelerator clips itself (with its precision's loss scale)."""
        del parameters, max_norm, norm_type
        return None

    def clip_grad_value_(
        self, parameters: torch.Tensor | Iterable[torch.Tensor], clip_value: float
    ) -> bool:
        """Clip gradient values held in a form of its own; False when the Accelerator clips
        them itself (each value bounded where it lies: true of whole gradients and shards)."""
        del parameters, clip_value
        return False

    # --- state dicts -----------------------------------------------------------------------

    def is_sharded(self, model: torch.nn.Module) -> bool:
        """True when each process holds only its part of ``model``'s weights."""
        del model
        return False

    def model_state_dict(self, model: torch.nn.Module, full: bool = True) -> dict[str, Any]:
        """``model``'s weights: whole (``full``; for a sharded model a collective that fills the
        main process's, on the CPU, and leaves the others empty) or this process's shards."""
        del full
        return model.state_dict()

    def load_model_state_dict(
        self, model: torch.nn.Module, state: dict[str, Any], full: bool = True
    ) -> None:
        """Load what :meth:`model_state_dict` gave (whole: every process passes it)."""
        del full
        model.load_state_dict(state)

    def optimizer_state_dict(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, full: bool = True
    ) -> dict[str, Any]:
        """The state of ``optimizer``, which updates ``model``: whole or this process's part."""
        del model, full
        return optimizer.state_dict()

    def load_optimizer_state_dict(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        state: dict[str, Any],
        full: bool = True,
    ) -> None:
        """Load what :meth:`optimizer_state_dict` gave."""
        del model, full
        optimizer.load_state_dict(state)

    def checkpoint_layout(self, models: list[torch.nn.Module]) -> str | None:
        """How a checkpoint holding ``models`` writes models and optimizers apart from the
        rest (``"FULL_STATE_DICT"``, ``"SHARDED_STATE_DICT"``), recorded in its metadata;
        None: the ordinary files, written by the main process."""
        del models
        return None

    # --- returned values -------------------------------------------------------------------

    @classmethod
    def worker_only_advice(cls, value: Any) -> str | None:
        """What to return instead of ``value`` when it is a part of this strategy's that only
        works in its worker (a shard); None for anything else."""
        del value
        return None
