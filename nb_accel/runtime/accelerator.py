"""The ``Accelerator`` facade: construction, ``prepare()`` and the training-loop methods.

It holds no logic of its own beyond routing: state lives in ``state``, sharding in the loader
modules, wrappers in ``model``/``optimizer``/``scheduler``, precision in ``precision``,
collectives in ``ops`` (reached through :class:`ProcessMethods`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

import torch

from .._keywords import parameter_names, refuse_unknown
from .checkpoint.methods import CheckpointMethods
from .data import loaders
from .engines import refuse_engines
from .fsdp.plugin import FullyShardedDataParallelPlugin
from .options import (
    HANDLER_NAMES,
    DataLoaderConfiguration,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    ProjectConfiguration,
)
from .parallelism import ParallelismConfig, fit_to_run, parallelism_from_environment
from .process_group import apply_process_group_options, init_process_group_kwargs
from .process_methods import ProcessMethods
from .sharding.fsdp2 import fsdp_plugin_from
from .state import AcceleratorState, GradientState, PartialState
from .tracking.methods import TrackingMethods
from .training.accumulation import GradientAccumulator
from .training.compile import DynamoBackend, TorchDynamoPlugin, dynamo_plugin_from
from .training.model import prepare_model, unwrap_model
from .training.optimizer import AcceleratedOptimizer
from .training.precision import check_precision_for_device, make_grad_scaler
from .training.profiling import ProfilingMethods
from .training.scheduler import AcceleratedScheduler
from .training.sharding_methods import ShardingMethods
from .training.training_methods import TrainingMethods

__all__ = ["Accelerator"]

_UNSET: Any = object()


def _handlers_by_name(handlers: Iterable[Any]) -> dict[str, Any]:
    """The kwargs handlers by class name: one of each kind the ``Accelerator`` uses."""
    found: dict[str, Any] = {}
    for handler in handlers:
        name = type(handler).__name__
        if name not in HANDLER_NAMES:
            raise TypeError(
                f"kwargs_handlers: {name} is not a handler the Accelerator uses; pass "
                f"{', '.join(HANDLER_NAMES)}"
            )
        if name in found:
            raise ValueError(f"kwargs_handlers holds two {name}: pass one, with every option")
        found[name] = handler
    return found


def _loader_config(
    config: DataLoaderConfiguration | None, **spelled: Any
) -> DataLoaderConfiguration:
    given = {k: v for k, v in spelled.items() if v is not _UNSET}
    if config is not None and given:
        raise ValueError(
            f"pass the data options either as dataloader_config=... or as {sorted(given)}, not both"
        )
    return config or DataLoaderConfiguration(**given)


def _accumulation(
    plugin: GradientAccumulationPlugin | None, steps: int
) -> GradientAccumulationPlugin:
    if plugin is not None and steps != 1:
        raise ValueError(
            "pass gradient accumulation either as gradient_accumulation_steps or as "
            "gradient_accumulation_plugin, not both"
        )
    if plugin is None and steps == 1:  # the launch's default (the saved configuration)
        steps = int(os.environ.get("NB_ACCEL_GRADIENT_ACCUMULATION_STEPS", "1"))
    return plugin or GradientAccumulationPlugin(num_steps=steps)


class Accelerator(
    ShardingMethods,
    ProcessMethods,
    TrainingMethods,
    TrackingMethods,
    CheckpointMethods,
    ProfilingMethods,
):
    """Everything a training loop needs to run on one or many processes, unchanged.

    Args:
        device_placement: move prepared models and batches to :attr:`device`.
        split_batches: split each batch across processes (see ``DataLoaderConfiguration``).
        mixed_precision: ``"no"``, ``"bf16"`` or ``"fp16"`` (CUDA only); defaults to the
            launch's ``mixed_precision``.
        gradient_accumulation_steps: batches per optimizer step.
        cpu: force the CPU.
        dataloader_config: the data options as one object (newer spelling).
        rng_types: generators synchronised at each new iteration of a prepared loader
            (``"torch"``, ``"cuda"``, ``"generator"``); default ``["generator"]``.
        project_dir: shortcut for ``project_config=ProjectConfiguration(project_dir)``.
        log_with: experiment trackers for :meth:`log`: a name (``"tensorboard"``, ``"wandb"``,
            ``"mlflow"``, ``"trackio"``, ``"aim"``, ``"comet_ml"``, ``"clearml"``,
            ``"dvclive"``, ``"swanlab"``), a ``LoggerType``, a ``GeneralTracker``, a list of
            them, or ``"all"`` (every tracker installed). Started by :meth:`init_trackers`;
            the live chart in the cell is always on.
        project_config: where checkpoints and tracker logs go.
        gradient_accumulation_plugin: accumulation options as one object (newer spelling).
        dispatch_batches: iterate loaders on the main process only and dispatch slices.
        even_batches: repeat samples so every process gets as many batches.
        use_seedable_sampler: use ``SeedableRandomSampler`` for shuffled loaders.
        step_scheduler_with_optimizer: step prepared schedulers with the optimizer (see
            ``AcceleratedScheduler``).
        kwargs_handlers: ``DistributedDataParallelKwargs``, ``GradScalerKwargs``,
            ``AutocastKwargs``, ``InitProcessGroupKwargs``, ``ProfileKwargs``.
        dynamo_backend: compile prepared models with ``torch.compile`` and this backend
            (``"inductor"``, ``"aot_eager"``...; default ``"no"``, or
            ``ACCELERATE_DYNAMO_BACKEND``).
        dynamo_plugin: the ``torch.compile`` options as one :class:`TorchDynamoPlugin`
            (not together with ``dynamo_backend``).
        fsdp_plugin: a :class:`FullyShardedDataParallelPlugin`: shard prepared models with
            FSDP2 instead of DDP (on by default in a ``notebook_launcher(..., fsdp=True)``).
        deepspeed_plugin: one of Accelerate's other engines; nb_accel does not run it and
            refuses it with ``NotImplementedError`` (so too ``deepspeed_plugins``,
            ``megatron_lm_plugin`` and ``torch_tp_plugin``).
        parallelism_config: a :class:`ParallelismConfig`: ``dp_replicate_size`` runs
            ``DistributedDataParallel`` over the processes, ``dp_shard_size`` shards the models
            over them with FSDP2 (a default ``FullyShardedDataParallelPlugin`` when none is
            given); tensor and context parallelism are refused.
        unknown: a keyword Accelerate's ``Accelerator`` has no parameter for raises
            ``TypeError``, naming the parameter it most likely meant.
    """

    #: Returned from a launched function it is refused (see ``worker/process/returns.py``).
    _nb_accel_worker_only = (
        "return what you computed with it instead: numbers, tensors, "
        "`accelerator.unwrap_model(model)` or its `state_dict()`"
    )

    def __init__(
        self,
        device_placement: bool = True,
        split_batches: bool = _UNSET,
        mixed_precision: str | None = None,
        gradient_accumulation_steps: int = 1,
        cpu: bool = False,
        dataloader_config: DataLoaderConfiguration | None = None,
        rng_types: list[str] | None = None,
        log_with: Any = None,
        project_dir: str | None = None,
        project_config: ProjectConfiguration | None = None,
        gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
        dispatch_batches: bool | None = _UNSET,
        even_batches: bool = _UNSET,
        use_seedable_sampler: bool = _UNSET,
        step_scheduler_with_optimizer: bool = True,
        kwargs_handlers: Iterable[Any] | None = None,
        dynamo_backend: DynamoBackend | str | None = None,
        dynamo_plugin: TorchDynamoPlugin | None = None,
        fsdp_plugin: Any = None,
        deepspeed_plugin: Any = None,
        megatron_lm_plugin: Any = None,
        torch_tp_plugin: Any = None,
        deepspeed_plugins: Any = None,
        parallelism_config: ParallelismConfig | None = None,
        **unknown: Any,
    ) -> None:
        refuse_unknown("Accelerator", unknown, parameter_names(Accelerator))
        refuse_engines(
            deepspeed_plugin=deepspeed_plugin,
            deepspeed_plugins=deepspeed_plugins,
            megatron_lm_plugin=megatron_lm_plugin,
            torch_tp_plugin=torch_tp_plugin,
        )
        fsdp_plugin = fsdp_plugin_from(fsdp_plugin)
        parallelism = parallelism_from_environment(parallelism_config)
        if parallelism is not None and parallelism.dp_shard_enabled and fsdp_plugin is None:
            fsdp_plugin = FullyShardedDataParallelPlugin()
        self._handlers = _handlers_by_name(kwargs_handlers or [])
        self._dynamo_plugin = dynamo_plugin_from(dynamo_backend, dynamo_plugin)
        init_handler = self._handlers.get(InitProcessGroupKwargs.__name__)
        self.state = AcceleratorState(
            mixed_precision=mixed_precision,
            cpu=cpu,
            dynamo_plugin=self._dynamo_plugin,
            fsdp_plugin=fsdp_plugin,
            **init_process_group_kwargs(init_handler),
        )
        self.state.dynamo_plugin = self._dynamo_plugin
        self.state.device_mesh = None
        if parallelism is not None:
            sharded = self.state.fsdp_plugin is not None
            fit_to_run(parallelism, self.state.num_processes, sharded, self.state.device_type)
            if self.state.num_processes > 1:  # every process builds it: its groups are made
                self.state.device_mesh = parallelism.get_device_mesh(self.state.device.type)
        self.state.parallelism_config = parallelism
        apply_process_group_options(init_handler)
        self._partial = PartialState()
        self._note_unsharded()
        check_precision_for_device(self.state.mixed_precision, self.device, self.state.device_type)
        self.dataloader_config = _loader_config(
            dataloader_config,
            split_batches=split_batches,
            dispatch_batches=dispatch_batches,
            even_batches=even_batches,
            use_seedable_sampler=use_seedable_sampler,
        )
        plugin = _accumulation(gradient_accumulation_plugin, gradient_accumulation_steps)
        self.gradient_state = GradientState(gradient_accumulation_plugin=plugin)
        self._accumulator = GradientAccumulator(self.gradient_state, plugin.sync_each_batch)
        self.project_configuration = project_config or ProjectConfiguration(project_dir)
        if project_dir is not None and project_config is not None:
            self.project_configuration.set_directories(project_dir)
        self._init_tracking(log_with)
        self.device_placement = device_placement
        self.rng_types = list(rng_types) if rng_types is not None else ["generator"]
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        scaler_options = self._handler_kwargs(GradScalerKwargs)
        self.scaler = make_grad_scaler(self.mixed_precision, self.device, **scaler_options)
        self.flag_tensor: torch.Tensor | None = None
        self._models: list[torch.nn.Module] = []
        self._optimizers: list[AcceleratedOptimizer] = []
        self._schedulers: list[AcceleratedScheduler] = []
        self._dataloaders: list[Any] = []
        self._custom_objects: list[Any] = []
        self._sharded: list[Any] = []  # what the strategy's wrap changed, per model

    def _handler_kwargs(self, kind: type) -> dict[str, Any]:
        handler = self._handlers.get(kind.__name__)
        return handler.to_kwargs() if handler is not None else {}

    @property
    def mixed_precision(self) -> str:
        """The mixed-precision mode: ``"no"``, ``"bf16"`` or ``"fp16"``."""
        return str(self.state.mixed_precision)

    @property
    def split_batches(self) -> bool:
        """Whether prepared loaders split batches across processes."""
        return self.dataloader_config.split_batches

    @property
    def dispatch_batches(self) -> bool | None:
        """Whether prepared loaders dispatch batches from the main process."""
        return self.dataloader_config.dispatch_batches

    @property
    def even_batches(self) -> bool:
        """Whether prepared loaders even out the last batches."""
        return self.dataloader_config.even_batches

    @property
    def use_seedable_sampler(self) -> bool:
        """Whether prepared shuffled loaders use ``SeedableRandomSampler``."""
        return self.dataloader_config.use_seedable_sampler

    @property
    def non_blocking(self) -> bool:
        """Whether prepared loaders copy batches to the device without blocking."""
        return self.dataloader_config.non_blocking

    @property
    def use_stateful_dataloader(self) -> bool:
        """Whether prepared loaders are built on torchdata's ``StatefulDataLoader``."""
        return self.dataloader_config.use_stateful_dataloader

    @property
    def project_dir(self) -> str | None:
        """The project folder, if any."""
        return self.project_configuration.project_dir

    # --- prepare --------------------------------------------------------------------------

    def prepare(self, *args: Any, device_placement: list[bool | None] | None = None) -> Any:
        """Prepare models, optimizers, schedulers and data loaders, in any number and order.

        Returns them in the same order (a single object when given one). Preparing an object
        twice is a no-op. Schedulers are prepared after the optimizers they follow; under FSDP,
        models before the optimizers (which then update the models' shards).
        """
        placements = device_placement or [None] * len(args)
        if len(placements) != len(args):
            raise ValueError(
                f"device_placement has {len(placements)} entries for {len(args)} objects"
            )
        result = list(args)
        finish = self.state.device_backend.prepare_objects(args)  # XLA: parameters move
        models_first = self._sharding.models_first
        for turn in (0, 1, 2):
            for index, (obj, place) in enumerate(zip(args, placements, strict=True)):
                if _turn(obj, models_first) == turn:
                    result[index] = self._prepare_one(obj, place)
        if finish is not None:
            finish(result)
        return result[0] if len(result) == 1 else tuple(result)

    def _prepare_one(self, obj: Any, device_placement: bool | None) -> Any:
        place = self.device_placement if device_placement is None else device_placement
        if isinstance(obj, torch.utils.data.DataLoader):
            return self.prepare_data_loader(obj, device_placement=place)
        if isinstance(obj, torch.nn.Module):
            return self.prepare_model(obj, device_placement=place)
        if isinstance(obj, torch.optim.Optimizer):
            return self.prepare_optimizer(obj, device_placement=place)
        if _is_scheduler(obj):
            return self.prepare_scheduler(obj)
        return obj

    def prepare_model(
        self,
        model: torch.nn.Module,
        device_placement: bool | None = None,
        evaluation_mode: bool = False,
    ) -> torch.nn.Module:
        """Device placement, autocast forward, the sharding strategy's wrap
        (DistributedDataParallel, FSDP2) and ``torch.compile`` (with a dynamo backend) for
        ``model``; ``evaluation_mode`` leaves out the wrap."""
        if any(model is m for m in self._models):
            return model
        place = self.device_placement if device_placement is None else device_placement
        prepared = prepare_model(
            model,
            self._sharding,
            self._model_setup(self.mixed_precision),
            place,
            wrap=not evaluation_mode,
            dynamo_plugin=self._dynamo_plugin,
        )
        self._models.append(prepared)
        return prepared

    def prepare_optimizer(
        self, optimizer: torch.optim.Optimizer, device_placement: bool | None = None
    ) -> AcceleratedOptimizer:
        """Wrap ``optimizer`` in an :class:`AcceleratedOptimizer` (under FSDP, moved onto the
        shards of the models prepared before it)."""
        if isinstance(optimizer, AcceleratedOptimizer):
            return optimizer
        self._sharding.prepare_optimizer(optimizer, self._model_setup(self.mixed_precision))
        place = self.device_placement if device_placement is None else device_placement
        wrapped = AcceleratedOptimizer(optimizer, place, self.scaler, self.device)
        self._optimizers.append(wrapped)
        return wrapped

    def prepare_scheduler(self, scheduler: Any) -> AcceleratedScheduler:
        """Wrap ``scheduler`` in an :class:`AcceleratedScheduler` following the optimizers."""
        if isinstance(scheduler, AcceleratedScheduler):
            return scheduler
        raw = getattr(scheduler, "optimizer", None)
        followed = [o for o in self._optimizers if o.optimizer is raw] or self._optimizers
        wrapped = AcceleratedScheduler(
            scheduler, followed, self.step_scheduler_with_optimizer, self.split_batches
        )
        self._schedulers.append(wrapped)
        return wrapped

    def prepare_data_loader(
        self,
        data_loader: torch.utils.data.DataLoader,
        device_placement: bool | None = None,
        slice_fn_for_dispatch: Callable[..., Any] | None = None,
    ) -> Any:
        """Rebuild ``data_loader`` as this process's shard (or a dispatcher, which cuts each
        process's slice with ``slice_fn_for_dispatch`` when given)."""
        if isinstance(data_loader, (loaders.DataLoaderShard, loaders.DataLoaderDispatcher)):
            return data_loader
        place = self.device_placement if device_placement is None else device_placement
        config = self.dataloader_config
        prepared = loaders.prepare_data_loader(
            data_loader,
            device=self.device,
            num_processes=self.num_processes,
            process_index=self.process_index,
            split_batches=config.split_batches,
            put_on_device=place,
            rng_types=list(self.rng_types),
            dispatch_batches=config.dispatch_batches,
            even_batches=config.even_batches,
            slice_fn_for_dispatch=slice_fn_for_dispatch,
            use_seedable_sampler=config.use_seedable_sampler,
            data_seed=config.data_seed,
            non_blocking=config.non_blocking,
            use_stateful_dataloader=config.use_stateful_dataloader,
            torch_device_mesh=self._batch_mesh(),
        )
        self._dataloaders.append(prepared)
        return prepared

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
        """A loader that starts ``num_batches`` batches into ``dataloader`` (for resuming)."""
        return loaders.skip_first_batches(dataloader, num_batches)

    def unwrap_model(
        self,
        model: torch.nn.Module,
        keep_fp32_wrapper: bool = True,
        keep_torch_compile: bool = False,
    ) -> torch.nn.Module:
        """The model as it was before :meth:`prepare` (DDP and ``torch.compile`` removed).

        ``keep_fp32_wrapper=False`` also removes the mixed-precision autocast forward;
        ``keep_torch_compile=True`` returns a compiled model compiled (the original model in a
        ``torch.compile`` wrapper, whose ``state_dict()`` keys start with ``_orig_mod.``).
        """
        return unwrap_model(model, keep_fp32_wrapper, keep_torch_compile)


def _turn(obj: Any, models_first: bool) -> int:
    """When ``prepare()`` takes ``obj``: schedulers last, and models first where the strategy
    says so (FSDP)."""
    if _is_scheduler(obj):
        return 2
    return 0 if models_first and isinstance(obj, torch.nn.Module) else 1


def _is_scheduler(obj: Any) -> bool:
    return isinstance(obj, (torch.optim.lr_scheduler.LRScheduler, AcceleratedScheduler)) or (
        hasattr(obj, "step") and hasattr(obj, "get_last_lr") and hasattr(obj, "optimizer")
    )
