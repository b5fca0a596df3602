"""Who am I: process index, world size, device and backend, built from the environment.

State is shared between instances of a class (as in Accelerate) and rebuilt in every worker at
the start of a launch, so nothing created in the kernel leaks into a launch or survives it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar, TypeVar

import torch
import torch.distributed as dist

from .._keywords import parameter_names, refuse_unknown
from .device_backends.base import DeviceBackend
from .device_backends.choice import choose as choose_device_backend
from .device_backends.shape_checks import debug_mode, set_debug_mode
from .device_types import DeviceType
from .engines import refuse_engines
from .enums import DistributedType
from .rank_local import RankLocalDict
from .sharding import ShardingStrategy, choose_strategy, default_strategy

__all__ = [
    "DistributedType",
    "PartialState",
    "AcceleratorState",
    "GradientState",
    "MIXED_PRECISION_CHOICES",
    "process_group_options",
    "reset_all_states",
]

MIXED_PRECISION_CHOICES = ("no", "bf16", "fp16")

F = TypeVar("F", bound=Callable[..., Any])

#: The options Accelerate's ``PartialState(**kwargs)`` passes on to ``init_process_group``
#: (``_use_sagemaker_dp`` it reads itself), as torch names them.
_GROUP_OPTIONS = (
    "backend",
    "init_method",
    "timeout",
    "world_size",
    "rank",
    "store",
    "group_name",
    "pg_options",
    "device_id",
    "_use_sagemaker_dp",
)


def process_group_options() -> list[str]:
    """The keyword names ``PartialState`` (and ``AcceleratorState``) take for the process
    group, as Accelerate's do: ``init_process_group``'s parameters (those of the installed
    torch too, as Accelerate passes them on). nb_accel uses ``backend``, ``init_method`` and
    ``timeout`` when it creates the group; the others are accepted and ignored."""
    names = list(_GROUP_OPTIONS)
    if dist.is_available():
        names += [n for n in parameter_names(dist.init_process_group) if n not in names]
    return names


class _SharedState:
    """Base of the state classes: every instance of a subclass shares one ``__dict__``."""

    #: Returned from a launched function it is refused (see ``worker/process/returns.py``).
    _nb_accel_worker_only = "return the values you need, such as `state.process_index`"

    _shared_state: ClassVar[RankLocalDict]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._shared_state = RankLocalDict()  # one per rank where ranks are threads (TPU v2/v3)

    @classmethod
    def _reset_state(cls) -> None:
        """Forget the shared state (done at the start of every worker)."""
        cls._shared_state.clear()

    @property
    def initialized(self) -> bool:
        """True once the state has been built."""
        return bool(self._shared_state.get("initialized"))


class PartialState(_SharedState):
    """The process's place in the launch: index, count, device and distributed type.

    Every instance shares one state (create as many as you like). Outside a launch it describes
    a single process; inside a worker it describes that worker's rank. Under ``torchrun`` (the
    environment names a world but no group exists yet) it creates the process group. Its
    ``device_backend``, chosen when the state is built, answers for the rank's devices (see
    :mod:`~nb_accel.runtime.device_backends`).

    Args:
        cpu: force the CPU even when GPUs are present.
        kwargs: ``backend``, ``init_method`` and ``timeout`` for the process group it creates;
            the other options of ``torch.distributed.init_process_group``, which Accelerate
            passes on, are accepted and ignored. Any other name raises ``TypeError``.
    """

    backend: str | None
    num_processes: int
    process_index: int
    local_process_index: int
    num_local_processes: int
    device: torch.device
    #: The kind of device :attr:`device` is: what the rank asks about its devices.
    device_type: DeviceType
    distributed_type: DistributedType

    def __init__(self, cpu: bool = False, **kwargs: Any) -> None:
        refuse_unknown("PartialState", kwargs, ["cpu", *process_group_options()])
        self._build(cpu, kwargs)

    def _build(self, cpu: bool, options: dict[str, Any]) -> None:
        """Share the state, building it from ``options`` (the process-group options, and the
        ``AcceleratorState``'s ``fsdp_plugin``) when it is not built yet."""
        self.__dict__ = self._shared_state
        if self._shared_state.get("initialized"):
            return
        device_backend = choose_device_backend(self)  # once per state: see device_backends
        self.__dict__.update(device_backend.rank_fields(cpu, options))
        self.device_backend: DeviceBackend = device_backend
        self._shared_state["initialized"] = True

    @property
    def use_distributed(self) -> bool:
        """True when more than one process takes part."""
        return self.num_processes > 1

    @property
    def debug(self) -> bool:
        """True when ``ACCELERATE_DEBUG_MODE`` is set: collectives then check that every process
        passes the same shapes, at the cost of one more collective each."""
        return debug_mode()

    @debug.setter
    def debug(self, enabled: bool) -> None:
        """Turn debug mode on or off for this process (every state of it sees the change)."""
        set_debug_mode(enabled)

    @property
    def default_device(self) -> torch.device:
        """The accelerator this machine offers (``cuda``, ``mps``), else the CPU, as
        Accelerate's ``default_device`` names it; the rank's own is :attr:`device`."""
        if torch.cuda.is_available():  # asks NVML: CUDA stays uninitialised
            return torch.device("cuda")
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")

    def set_device(self) -> None:
        """Nothing left to do: :attr:`device` is chosen when the state is built (Accelerate's
        ``set_device`` likewise returns once it is set)."""

    @property
    def is_main_process(self) -> bool:
        """True on the process with index 0 only."""
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        """True on the first process of each node."""
        return self.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        """True on the process with the highest index."""
        return self.process_index == self.num_processes - 1

    def wait_for_everyone(self) -> None:
        """Block until every process reaches this point (a barrier); no-op on one process."""
        self.device_backend.barrier()

    @contextmanager
    def _goes_first(self, is_first: bool) -> Iterator[None]:
        if not is_first:
            self.wait_for_everyone()
        yield
        if is_first:
            self.wait_for_everyone()

    @contextmanager
    def main_process_first(self) -> Iterator[None]:
        """Run the block on the main process first, then on the others.

        If the main process raises inside the block, the launch reports it at once and stops
        the ranks that are waiting; they do not sit out the collective timeout.
        """
        with self._goes_first(self.is_main_process):
            yield

    @contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """Run the block on each node's first process first, then on the node's others."""
        with self._goes_first(self.is_local_main_process):
            yield

    def on_main_process(self, function: F) -> F:
        """Decorator: run ``function`` on the main process only (returns ``None`` elsewhere)."""
        return self.on_process(function, process_index=0)

    def on_local_main_process(self, function: F) -> F:
        """Decorator: run ``function`` on each node's first process only."""
        return self.on_local_process(function, local_process_index=0)  # type: ignore[no-any-return]

    def on_last_process(self, function: F) -> F:
        """Decorator: run ``function`` on the last process only."""
        return self.on_process(function, process_index=self.num_processes - 1)

    def on_process(self, function: F | None = None, process_index: int | None = None) -> Any:
        """Decorator: run ``function`` on process ``process_index`` only.

        Usable as ``@state.on_process(process_index=1)`` or ``state.on_process(fn, 1)``.
        """
        return self._run_on("process_index", process_index, function)

    def on_local_process(
        self, function: F | None = None, local_process_index: int | None = None
    ) -> Any:
        """Decorator: run ``function`` on local process ``local_process_index`` of each node."""
        return self._run_on("local_process_index", local_process_index, function)

    def _run_on(self, attribute: str, index: int | None, function: F | None) -> Any:
        if index is None:
            raise ValueError(f"on_{attribute[:-6]} needs {attribute}=<the process that runs it>")
        if function is None:
            return lambda fn: self._run_on(attribute, index, fn)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return function(*args, **kwargs) if getattr(self, attribute) == index else None

        return _wraps(function, wrapper)

    @contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """Give each process its contiguous share of ``inputs`` (a list, tuple, dict of lists,
        or tensor), earlier processes taking one extra item when it does not divide evenly.

        With ``apply_padding=True`` every share is padded with the last item to equal length.
        """
        from .splitting import split_for_process

        yield split_for_process(inputs, self.num_processes, self.process_index, apply_padding)

    def destroy_process_group(self, group: Any | None = None) -> None:
        """Destroy ``group``, or the default process group when it is left out.

        In a function nb_accel launched, the default group belongs to the launch (with
        ``%%distributed``, to the cells that follow too): left out, nothing happens, as in
        Accelerate's notebook launches, and nb_accel destroys it when the function returns.
        """
        if group is None and os.environ.get("NB_ACCEL_LAUNCHED") == "1":
            return
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group(group)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on each node's first process only."""
        if self.is_local_main_process:
            print(*args, **kwargs)

    def __repr__(self) -> str:
        backend = f"  Backend: {self.backend}" if self.backend else ""
        return (
            f"Distributed environment: {self.distributed_type.value}{backend}\n"
            f"Num processes: {self.num_processes}\n"
            f"Process index: {self.process_index}\n"
            f"Local process index: {self.local_process_index}\n"
            f"Device: {self.device}\n"
        )


def _wraps(function: F, wrapper: Callable[..., Any]) -> F:
    import functools

    return functools.wraps(function)(wrapper)  # type: ignore[return-value]


class AcceleratorState(_SharedState):
    """The :class:`PartialState` plus the training options every instance shares.

    Attribute access falls through to the :class:`PartialState` (``device``,
    ``process_index``, ...).

    Args:
        mixed_precision: ``"no"``, ``"bf16"`` or ``"fp16"``; defaults to the launch's setting.
        cpu: force the CPU.
        dynamo_plugin: the ``torch.compile`` options (a ``TorchDynamoPlugin``).
        deepspeed_plugin: one of Accelerate's other engines; nb_accel does not run it and
            refuses it with ``NotImplementedError`` (so too ``torch_tp_plugin`` and
            ``megatron_lm_plugin``).
        fsdp_plugin: a ``FullyShardedDataParallelPlugin``: models are sharded with FSDP2.
        torch_tp_plugin: refused when given (tensor parallelism).
        megatron_lm_plugin: refused when given (Megatron-LM).
        parallelism_config: the ``ParallelismConfig`` (the ``Accelerator`` sets it too).
        _from_accelerator: accepted for Accelerate's sake; nb_accel's state may be made
            before the ``Accelerator``.
        kwargs: the process-group options of :class:`PartialState`; any other name raises
            ``TypeError``.
    """

    #: The ``Accelerator``'s :class:`~nb_accel.runtime.parallelism.ParallelismConfig` (None:
    #: none given), set when it is made.
    parallelism_config: Any
    #: Its device mesh (None: none, or one process).
    device_mesh: Any

    def __init__(
        self,
        mixed_precision: str | None = None,
        cpu: bool = False,
        dynamo_plugin: Any = None,
        deepspeed_plugin: Any = None,
        fsdp_plugin: Any = None,
        torch_tp_plugin: Any = None,
        megatron_lm_plugin: Any = None,
        parallelism_config: Any = None,
        _from_accelerator: bool = False,
        **kwargs: Any,
    ) -> None:
        refuse_unknown(
            "AcceleratorState",
            kwargs,
            [*parameter_names(AcceleratorState), *process_group_options()],
        )
        refuse_engines(
            deepspeed_plugin=deepspeed_plugin,
            megatron_lm_plugin=megatron_lm_plugin,
            torch_tp_plugin=torch_tp_plugin,
        )
        self.__dict__ = self._shared_state
        sharding = {"fsdp_plugin": fsdp_plugin}
        if self._shared_state.get("initialized"):
            if mixed_precision is not None and mixed_precision != self.mixed_precision:
                raise ValueError(
                    f"AcceleratorState already uses mixed_precision={self.mixed_precision!r}; "
                    "create the Accelerator with that value (or none) rather than "
                    f"{mixed_precision!r}"
                )
            if fsdp_plugin is not None:
                self._shared_state["fsdp_plugin"] = fsdp_plugin
                self._shared_state["_sharding"] = choose_strategy(sharding)
            if parallelism_config is not None:
                self.parallelism_config = parallelism_config
            return
        chosen = mixed_precision or os.environ.get("NB_ACCEL_MIXED_PRECISION")
        chosen = str(chosen or os.environ.get("ACCELERATE_MIXED_PRECISION", "no")).lower()
        if chosen not in MIXED_PRECISION_CHOICES:
            raise ValueError(
                f"mixed_precision={chosen!r} is not supported; use one of "
                + ", ".join(repr(c) for c in MIXED_PRECISION_CHOICES)
            )
        PartialState.__new__(PartialState)._build(cpu, {**kwargs, **sharding})
        self.mixed_precision: str = chosen
        self.dynamo_plugin: Any = dynamo_plugin
        self.fsdp_plugin: Any = fsdp_plugin
        self.parallelism_config = parallelism_config
        self._shared_state["_sharding"] = choose_strategy(sharding)
        self._shared_state["initialized"] = True

    @classmethod
    def _reset_state(cls, reset_partial_state: bool = False) -> None:
        """Forget the shared state; with ``reset_partial_state`` the :class:`PartialState`'s
        too (as Accelerate's test fixtures ask)."""
        super()._reset_state()
        if reset_partial_state:
            PartialState._reset_state()

    @property
    def distributed_type(self) -> DistributedType:
        """What the sharding strategy reports on the :class:`PartialState`'s kind (or on what
        was assigned, as Accelerate's tests do): ``FSDP`` when models are sharded."""
        kind = self._shared_state.get("distributed_type") or PartialState().distributed_type
        return self.chosen_sharding.distributed_type(kind)

    @distributed_type.setter
    def distributed_type(self, kind: DistributedType) -> None:
        self._shared_state["distributed_type"] = kind

    @property
    def is_fsdp2(self) -> bool:
        """True when prepared models are sharded with FSDP2."""
        return self.distributed_type == DistributedType.FSDP

    @property
    def deepspeed_plugin(self) -> None:
        """None: nb_accel does not run DeepSpeed."""
        return None

    def get_deepspeed_plugin(self, name: str) -> Any:
        """Refused: nb_accel does not run DeepSpeed."""
        raise NotImplementedError(f"get_deepspeed_plugin({name!r}): DeepSpeed is not supported")

    def select_deepspeed_plugin(self, name: str | None = None) -> None:
        """Refused: nb_accel does not run DeepSpeed."""
        raise NotImplementedError(f"select_deepspeed_plugin({name!r}): DeepSpeed is not supported")

    @property
    def chosen_sharding(self) -> ShardingStrategy:
        """The sharding strategy chosen when the state was made (from ``fsdp_plugin``)."""
        chosen = self._shared_state.get("_sharding")
        return chosen if chosen is not None else default_strategy()

    @property
    def sharding(self) -> ShardingStrategy:
        """The sharding strategy prepared models get: the chosen one where it runs on this
        process's kind, else the default (data parallel; on one process, models as they are)."""
        chosen = self.chosen_sharding
        kind = self._shared_state.get("distributed_type") or PartialState().distributed_type
        return chosen if chosen.runs_on(kind) else default_strategy()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if not self._shared_state.get("initialized") and not hasattr(PartialState, name):
            raise AttributeError(
                f"`AcceleratorState` object has no attribute `{name}`: its shared state is "
                "empty. This happens if `AcceleratorState._reset_state()` was called after the "
                "Accelerator was created; create the Accelerator again"
            )
        return getattr(PartialState(), name)

    @property
    def partial(self) -> PartialState:
        """The process's :class:`PartialState` (shared by every instance)."""
        return PartialState()


class GradientState(_SharedState):
    """Shared gradient-synchronisation state: accumulation steps, whether this step syncs, and
    the data loader being iterated (for ``end_of_dataloader`` and ``remainder``).

    Args:
        gradient_accumulation_plugin: its ``num_steps``, ``adjust_scheduler`` and
            ``sync_with_dataloader`` are adopted when given.
    """

    def __init__(self, gradient_accumulation_plugin: Any | None = None) -> None:
        self.__dict__ = self._shared_state
        if not self._shared_state.get("initialized"):
            self.sync_gradients = True
            self.active_dataloader: Any | None = None
            self.dataloader_references: list[Any] = [None]
            self.num_steps = 1
            self.adjust_scheduler = True
            self.sync_with_dataloader = True
            self._shared_state["initialized"] = True
        if gradient_accumulation_plugin is not None:
            self.num_steps = gradient_accumulation_plugin.num_steps
            self.adjust_scheduler = gradient_accumulation_plugin.adjust_scheduler
            self.sync_with_dataloader = gradient_accumulation_plugin.sync_with_dataloader

    @property
    def end_of_dataloader(self) -> bool:
        """True while the last batch of the active data loader is being processed."""
        return bool(self.active_dataloader is not None and self.active_dataloader.end_of_dataloader)

    @property
    def remainder(self) -> int:
        """Samples in the last batch that are real (not padding); -1 when unknown."""
        if self.active_dataloader is None:
            return -1
        return int(self.active_dataloader.remainder)

    @property
    def in_dataloader(self) -> bool:
        """True while a prepared data loader is being iterated."""
        return self.active_dataloader is not None

    def _set_sync_gradients(self, sync_gradients: bool) -> None:
        self.sync_gradients = sync_gradients

    def _add_dataloader(self, dataloader: Any) -> None:
        """Called by a prepared loader when an iteration over it starts."""
        self.active_dataloader = dataloader
        self.dataloader_references.append(dataloader)

    def _remove_dataloader(self, dataloader: Any) -> None:
        """Called by a prepared loader when its iteration ends (or is abandoned)."""
        if dataloader in self.dataloader_references:
            self.dataloader_references.remove(dataloader)
        self.active_dataloader = self.dataloader_references[-1]


def reset_all_states() -> None:
    """Forget every shared state; the next instances are rebuilt from the environment."""
    PartialState._reset_state()
    AcceleratorState._reset_state()
    GradientState._reset_state()
    set_debug_mode(None)
