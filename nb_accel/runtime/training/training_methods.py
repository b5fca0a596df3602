"""The Accelerator's training-loop methods: backward, accumulation, clipping, precision."""

from __future__ import annotations

import contextlib
import gc
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.distributed.algorithms.join import Join, Joinable

from ..data.loader_shard import shard_sampler_of
from ..options import AutocastKwargs, DataLoaderConfiguration
from ..sharding.registry import no_sync, sync_in_backward
from ..state import AcceleratorState, DistributedType, GradientState, PartialState
from .accumulation import GradientAccumulator
from .optimizer import AcceleratedOptimizer
from .precision import autocast_context, clip_scaled_grad_norm_, clip_scaled_grad_value_
from .scheduler import AcceleratedScheduler

__all__ = ["TrainingMethods"]


class TrainingMethods:
    """Mixin of :class:`Accelerator`: what happens inside the training loop."""

    gradient_state: GradientState
    scaler: Any | None
    _accumulator: GradientAccumulator
    _handlers: dict[str, Any]
    _models: list[torch.nn.Module]
    _optimizers: list[AcceleratedOptimizer]
    _schedulers: list[AcceleratedScheduler]
    _dataloaders: list[Any]

    _partial: PartialState
    state: AcceleratorState
    dataloader_config: DataLoaderConfiguration

    @property
    def gradient_accumulation_steps(self) -> int:
        """Batches per optimizer step."""
        return int(self.gradient_state.num_steps)

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, steps: int) -> None:
        self.gradient_state.num_steps = steps

    @property
    def sync_gradients(self) -> bool:
        """True on the batches where gradients are synchronised and the optimizer steps."""
        return bool(self.gradient_state.sync_gradients)

    @sync_gradients.setter
    def sync_gradients(self, value: bool) -> None:
        self.gradient_state._set_sync_gradients(value)

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """True when an fp16 optimizer step was skipped because of inf/NaN gradients."""
        return any(optimizer.step_was_skipped for optimizer in self._optimizers)

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward()``, divided by the accumulation steps and scaled under fp16."""
        if self.gradient_accumulation_steps > 1:
            loss = loss / self.gradient_accumulation_steps
        if self.scaler is not None:
            self.scaler.scale(loss).backward(**kwargs)
        else:
            loss.backward(**kwargs)

    def lomo_backward(self, loss: torch.Tensor, learning_rate: float) -> None:
        """Refused: nb_accel does not run LOMO optimizers (``lomo_optim``); use
        :meth:`backward` with a torch optimizer."""
        del loss, learning_rate
        raise NotImplementedError(
            "lomo_backward: LOMO optimizers are not supported by nb_accel; use "
            "accelerator.backward(loss) with a torch optimizer"
        )

    @property
    def fp8_backend(self) -> None:
        """None: nb_accel does not train in FP8."""
        return None

    @contextlib.contextmanager
    def accumulate(self, *models: torch.nn.Module) -> Iterator[None]:
        """One batch under gradient accumulation: no gradient sync (DDP's all-reduce, FSDP's
        reduce-scatter) until a synchronising step."""
        with self._accumulator.accumulate(*models):
            yield

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module) -> Iterator[None]:
        """Skip the gradient sync inside the block (DDP's all-reduce, FSDP's reduce-scatter):
        gradients accumulate locally."""
        with no_sync(model):
            yield

    @staticmethod
    @contextlib.contextmanager
    def trigger_sync_in_backward(model: torch.nn.Module) -> Iterator[None]:
        """Make the next backward pass of ``model`` all-reduce its gradients, even inside
        :meth:`no_sync` or a non-synchronising :meth:`accumulate` step (the forward pass may
        have run there). A no-op for a model neither wrapped in DistributedDataParallel nor
        sharded (each sharding strategy acts on the models it prepared)."""
        with sync_in_backward(model):
            yield

    @contextlib.contextmanager
    def join_uneven_inputs(
        self, joinables: Sequence[Joinable], even_batches: bool | None = None
    ) -> Iterator[None]:
        """Train or evaluate with processes that get different numbers of batches: torch's
        ``Join`` over ``joinables`` (models prepared with DistributedDataParallel, or other
        ``Joinable`` objects) shadows the collectives of the processes that ran out of batches.

        ``even_batches`` overrides the Accelerator's setting in the prepared loaders for the
        block (loaders without a sharded batch sampler, such as iterable or dispatching ones,
        keep theirs, with a warning). The join is active only when batches are not evened out.
        A single process, or a launch not using DistributedDataParallel, runs the block as is.
        """
        if self.state.distributed_type not in (
            DistributedType.MULTI_CPU,
            DistributedType.MULTI_GPU,
        ):
            if self.state.distributed_type != DistributedType.NO:
                warnings.warn(
                    "join_uneven_inputs is only supported for multi-GPU and multi-CPU training "
                    "with DistributedDataParallel; it has no effect under "
                    f"{self.state.distributed_type.value}",
                    stacklevel=3,
                )
            yield
            return
        restore: list[tuple[Any, bool]] = []
        if even_batches is None:
            even_batches = self.dataloader_config.even_batches
        else:
            skipped = False
            for loader in self._dataloaders:
                shard, _ = shard_sampler_of(getattr(loader, "batch_sampler", None))
                if shard is None:
                    skipped = True
                    continue
                restore.append((shard, shard.even_batches))
                shard.even_batches = even_batches
            if skipped:
                warnings.warn(
                    "Overriding even_batches is only supported for map-style datasets: "
                    "join_uneven_inputs leaves the iterable or dispatching loaders' own setting",
                    stacklevel=3,
                )
        try:
            joined = [self.state.sharding.joinable(j) for j in joinables]
            with Join(joined, enable=not even_batches, throw_on_early_termination=False):
                yield
        finally:
            for shard, value in restore:
                shard.even_batches = value

    def unscale_gradients(self, optimizer: Any | None = None) -> None:
        """Divide gradients by the fp16 loss scale (done for you by the clipping methods).

        Gradients are unscaled on the synchronising batch only; while they accumulate they
        keep the scale, and the clipping methods account for it.
        """
        targets = [optimizer] if optimizer is not None else self._optimizers
        for target in targets:
            if isinstance(target, AcceleratedOptimizer):
                target.unscale_gradients()

    def clip_grad_norm_(
        self, parameters: Any, max_norm: float, norm_type: float = 2
    ) -> torch.Tensor:
        """Clip the gradients' norm; returns the total norm before clipping.

        Under fp16 the result is the same as in full precision on every batch: on the
        synchronising batch the gradients are unscaled first; while accumulating (they still
        carry the loss scale) the norm is measured and clipped as if they were unscaled.
        """
        if not isinstance(parameters, torch.Tensor):
            parameters = list(parameters)  # a generator is read by the strategy, then here
        self.unscale_gradients()
        self._reduce_gradients_before_clipping()
        clipped = self.state.sharding.clip_grad_norm_(parameters, max_norm, norm_type)
        if clipped is not None:  # gradients the strategy holds its own way (shards)
            return clipped
        if self._gradients_carry_loss_scale():
            return clip_scaled_grad_norm_(parameters, max_norm, norm_type, self.scaler)
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        """Clip each gradient value to ``[-clip_value, clip_value]`` (of the unscaled gradient
        under fp16, on every batch, as :meth:`clip_grad_norm_`)."""
        self.unscale_gradients()
        self._reduce_gradients_before_clipping()
        if self.state.sharding.clip_grad_value_(parameters, clip_value):
            return
        if self._gradients_carry_loss_scale():
            clip_scaled_grad_value_(parameters, clip_value, self.scaler)
        else:
            torch.nn.utils.clip_grad_value_(parameters, clip_value)

    def _gradients_carry_loss_scale(self) -> bool:
        """True under fp16 while no optimizer has unscaled this step's gradients."""
        if self.scaler is None:
            return False
        return not any(optimizer.gradients_unscaled for optimizer in self._optimizers)

    def _reduce_gradients_before_clipping(self) -> None:
        """Where the device backend steps optimizers, gradients are clipped once averaged
        across ranks (as DDP has them)."""
        for optimizer in self._optimizers:
            optimizer._reduce_gradients_before_clipping()

    def autocast(
        self, autocast_handler: AutocastKwargs | None = None
    ) -> contextlib.AbstractContextManager[Any]:
        """Run the block under this Accelerator's mixed precision (a no-op with ``"no"``)."""
        options = autocast_handler or self._handlers.get("AutocastKwargs") or AutocastKwargs()
        return autocast_context(
            self.state.mixed_precision, self._partial.device, **options.to_kwargs()
        )

    def free_memory(self, *objects: Any) -> list[None]:
        """Drop the references this Accelerator holds, collect garbage, empty the CUDA cache.

        Returns one ``None`` per object passed, to rebind them:
        ``model, opt = accelerator.free_memory(model, opt)``.
        """
        self._models.clear()
        self._optimizers.clear()
        self._schedulers.clear()
        self._dataloaders.clear()
        gc.collect()
        self._partial.device_type.empty_cache()
        return [None for _ in objects]

    def clear(self, *objects: Any) -> list[None]:
        """Another name of :meth:`free_memory` (Accelerate has both)."""
        return self.free_memory(*objects)
