"""``AcceleratedOptimizer``: steps only when gradients are synchronised, scales under fp16."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..state import GradientState, PartialState

__all__ = ["AcceleratedOptimizer"]


def _move_state(state: dict[Any, Any], device: torch.device) -> dict[Any, Any]:
    def move(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return value.to(device)
        if isinstance(value, dict):
            return {k: move(v) for k, v in value.items()}
        return value

    return move(state)  # type: ignore[no-any-return]


class AcceleratedOptimizer(torch.optim.Optimizer):
    """Wraps an optimizer so it follows gradient accumulation and mixed precision.

    ``step`` and ``zero_grad`` do nothing while gradients are being accumulated (they act on
    the synchronising step only). With an fp16 ``scaler`` the step goes through the scaler,
    and :attr:`step_was_skipped` tells whether inf/NaN gradients made it skip the update.

    Args:
        optimizer: the optimizer to wrap.
        device_placement: move the optimizer's state to ``device`` (when given).
        scaler: a ``torch.amp.GradScaler`` for fp16, or ``None``.
        device: where the model's parameters live.
    """

    #: Returned from a launched function it is refused (see ``worker/process/returns.py``).
    _nb_accel_worker_only = (
        "return `optimizer.state_dict()` and load it into a new optimizer with `load_state_dict`"
    )

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        device_placement: bool = True,
        scaler: Any | None = None,
        device: torch.device | None = None,
    ) -> None:
        # Deliberately no super().__init__: this object is a view on ``optimizer``.
        self.optimizer = optimizer
        self.scaler = scaler
        self.gradient_state = GradientState()
        self.device_placement = device_placement
        self._is_overflow = False
        self._unscaled = False
        # the device backend steps the optimizer itself (XLA: no DDP, gradients reduced here)
        self._device_steps = device is not None and PartialState().device_backend.steps_optimizers
        self._gradients_reduced = False  # by the device backend already this step
        if device_placement and device is not None and optimizer.state:
            optimizer.load_state_dict(_move_state(optimizer.state_dict(), device))

    @property
    def state(self) -> Any:  # type: ignore[override]
        """The wrapped optimizer's per-parameter state."""
        return self.optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.optimizer.state = value

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """The wrapped optimizer's parameter groups."""
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = value

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        """The wrapped optimizer's defaults."""
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.optimizer.defaults = value

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a parameter group to the wrapped optimizer."""
        self.optimizer.add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        """The wrapped optimizer's state dict."""
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        """Load into the wrapped optimizer."""
        self.optimizer.load_state_dict(state_dict)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients, on synchronising steps only."""
        if self.gradient_state.sync_gradients:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def unscale_gradients(self) -> None:
        """Divide the gradients by the fp16 loss scale, once per step, on the synchronising
        batch only: while gradients accumulate they keep the scale (the scaler can unscale an
        optimizer once between updates). A no-op without a scaler."""
        if self.scaler is not None and not self._unscaled and self.gradient_state.sync_gradients:
            self.scaler.unscale_(self.optimizer)
            self._unscaled = True

    @property
    def gradients_unscaled(self) -> bool:
        """True once :meth:`unscale_gradients` divided this step's gradients by the loss scale."""
        return self._unscaled

    def step(self, closure: Callable[[], float] | None = None) -> Any:  # type: ignore[override]
        """Update the parameters, on synchronising steps only (through the scaler under fp16)."""
        if not self.gradient_state.sync_gradients:
            return None
        self._unscaled = False
        if self._device_steps:
            reduced, self._gradients_reduced = self._gradients_reduced, False
            self._is_overflow = False
            backend = PartialState().device_backend
            return backend.optimizer_step(self.optimizer, closure, reduced)
        if self.scaler is None:
            self._is_overflow = False
            return self.optimizer.step(closure) if closure is not None else self.optimizer.step()
        scale_before = self.scaler.get_scale()
        self.scaler.step(self.optimizer, closure) if closure is not None else self.scaler.step(
            self.optimizer
        )
        self.scaler.update()
        self._is_overflow = self.scaler.get_scale() < scale_before
        return None

    def _reduce_gradients_before_clipping(self) -> None:
        """Where the device backend steps optimizers (XLA), average the gradients across ranks
        now (before clipping), once per step."""
        reduce_now = not self._gradients_reduced and self.gradient_state.sync_gradients
        if self._device_steps and reduce_now:
            PartialState().device_backend.reduce_gradients(self.optimizer)
            self._gradients_reduced = True

    @property
    def step_was_skipped(self) -> bool:
        """True when the last step was skipped because of inf/NaN gradients (fp16)."""
        return self._is_overflow

    @property
    def is_overflow(self) -> bool:
        """Same as :attr:`step_was_skipped` (older name)."""
        return self._is_overflow

    def train(self) -> None:
        """Forward ``train()`` to optimizers that have it (schedule-free optimizers)."""
        if hasattr(self.optimizer, "train"):
            self.optimizer.train()

    def eval(self) -> None:
        """Forward ``eval()`` to optimizers that have it."""
        if hasattr(self.optimizer, "eval"):
            self.optimizer.eval()

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"AcceleratedOptimizer({self.optimizer!r})"
