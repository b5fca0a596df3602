"""``AcceleratedScheduler``: a learning-rate scheduler that steps with the real optimizer steps."""

from __future__ import annotations

from typing import Any

from ..state import GradientState, PartialState

__all__ = ["AcceleratedScheduler"]


class AcceleratedScheduler:
    """Wraps a learning-rate scheduler so that it follows the optimizer(s).

    How many times one ``step()`` call advances the schedule:

    * not at all while gradients are being accumulated, or when an optimizer skipped its
      update (fp16 overflow);
    * once with ``split_batches=True``: each optimizer step then consumes one batch of the
      original data loader, exactly as in a single-process run;
    * otherwise once **per process**: each process consumed its own batch, so one optimizer
      step covered ``num_processes`` batches of the original loader. A schedule written for a
      single process ("warm up over 1000 batches") therefore keeps its meaning.

    With ``step_with_optimizer=False`` every call steps the scheduler once, unconditionally.

    Args:
        scheduler: the scheduler to wrap.
        optimizers: the prepared optimizer(s) the schedule follows.
        step_with_optimizer: apply the rules above.
        split_batches: whether prepared loaders split batches across processes.
    """

    #: Returned from a launched function it is refused (see ``worker/process/returns.py``).
    _nb_accel_worker_only = "return `scheduler.state_dict()` instead"

    def __init__(
        self,
        scheduler: Any,
        optimizers: Any,
        step_with_optimizer: bool = True,
        split_batches: bool = False,
    ) -> None:
        self.scheduler = scheduler
        self.optimizers = (
            list(optimizers) if isinstance(optimizers, (list, tuple)) else [optimizers]
        )
        self.step_with_optimizer = step_with_optimizer
        self.split_batches = split_batches
        self.gradient_state = GradientState()

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Advance the schedule following the rules in the class docstring."""
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        if not self.gradient_state.sync_gradients:
            if self.gradient_state.adjust_scheduler:
                self.scheduler._step_count += 1
            return
        if any(getattr(opt, "step_was_skipped", False) for opt in self.optimizers):
            return
        if self.split_batches:
            self.scheduler.step(*args, **kwargs)
            return
        for _ in range(PartialState().num_processes):
            total = getattr(self.scheduler, "total_steps", None)
            if total is not None and self.scheduler.last_epoch >= total:
                break  # OneCycleLR-style schedules must not run past their end
            self.scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        """The last learning rates computed by the scheduler."""
        return list(self.scheduler.get_last_lr())

    def state_dict(self) -> dict[str, Any]:
        """The scheduler's state dict."""
        return dict(self.scheduler.state_dict())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load the scheduler's state dict."""
        self.scheduler.load_state_dict(state_dict)

    def get_lr(self) -> Any:
        """The scheduler's ``get_lr()``."""
        return self.scheduler.get_lr()

    def print_lr(self, *args: Any, **kwargs: Any) -> Any:
        """The scheduler's ``print_lr()``."""
        return self.scheduler.print_lr(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name == "scheduler":
            raise AttributeError(name)
        return getattr(self.scheduler, name)
