"""Mixed precision: autocast contexts, the fp16 gradient scaler, fp32 model outputs."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import torch

from ..device_types import DeviceType
from ..state import AcceleratorState, PartialState
from ..tree import recursively_apply

__all__ = [
    "check_precision_for_device",
    "autocast_context",
    "make_grad_scaler",
    "get_grad_scaler",
    "get_mixed_precision_context_manager",
    "convert_to_fp32",
    "convert_outputs_to_fp32",
    "autocast_forward",
    "clip_scaled_grad_norm_",
    "clip_scaled_grad_value_",
]

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def check_precision_for_device(
    mixed_precision: str, device: torch.device, device_type: DeviceType
) -> None:
    """Raise ``ValueError`` for a precision the rank's ``device`` (of ``device_type``) cannot
    run, as its type says (fp16 on XLA devices): see
    :meth:`~nb_accel.runtime.device_types.DeviceType.supports_precision`."""
    if not device_type.supports_precision(mixed_precision):
        raise ValueError(
            f"mixed_precision={mixed_precision!r} does not run on {device_type.label}s (this "
            f"process runs on {device.type}); use mixed_precision='bf16', or 'no'"
        )


def autocast_context(
    mixed_precision: str, device: torch.device, enabled: bool = True, **kwargs: Any
) -> contextlib.AbstractContextManager[Any]:
    """The ``torch.autocast`` context for ``mixed_precision`` on ``device`` (or a no-op)."""
    dtype = _DTYPES.get(mixed_precision)
    if dtype is None or not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype, **kwargs)


def make_grad_scaler(mixed_precision: str, device: torch.device, **kwargs: Any) -> Any | None:
    """A ``GradScaler`` for ``device``'s type (CUDA's or the CPU's) with fp16; ``None`` otherwise
    (bf16 needs none)."""
    if mixed_precision != "fp16":
        return None
    return torch.amp.GradScaler(device.type, **kwargs)


def get_grad_scaler(distributed_type: Any = None, **kwargs: Any) -> torch.amp.GradScaler:
    """A ``torch.amp.GradScaler`` for this process's device, ``kwargs`` its options (as
    Accelerate's helper; FSDP2 shards use the same scaler, so ``distributed_type`` changes
    nothing)."""
    del distributed_type
    return torch.amp.GradScaler(PartialState().device.type, **kwargs)


def get_mixed_precision_context_manager(
    native_amp: bool = False, autocast_kwargs: Any = None
) -> contextlib.AbstractContextManager[Any]:
    """The ``torch.autocast`` context of the ``AcceleratorState``'s mixed precision on this
    process's device when ``native_amp`` (``autocast_kwargs``, an ``AutocastKwargs``, adds its
    options); a no-op otherwise."""
    if not native_amp:
        return contextlib.nullcontext()
    options = autocast_kwargs.to_kwargs() if autocast_kwargs is not None else {}
    state = AcceleratorState()
    return autocast_context(str(state.mixed_precision), state.device, **options)


def _gradients(parameters: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    return params, [p.grad for p in params if p.grad is not None]


def _loss_scale(scaler: Any, device: torch.device) -> torch.Tensor:
    """The scale the gradients carry, as a tensor on ``device`` (no host synchronisation)."""
    return scaler.scale(torch.ones((), device=device))  # type: ignore[no-any-return]


def clip_scaled_grad_norm_(
    parameters: Any, max_norm: float, norm_type: float, scaler: Any
) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` for gradients still multiplied by the fp16 loss scale.

    The norm is measured on the true (unscaled) gradients and the same factor is applied as
    in full precision, so the gradients stay scaled and the result equals clipping unscaled
    gradients. Returns the true total norm.
    """
    params, grads = _gradients(parameters)
    if not grads:
        return torch.tensor(0.0)
    total_norm = torch.nn.utils.get_total_norm(grads, norm_type)
    total_norm = total_norm / _loss_scale(scaler, total_norm.device)
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total_norm)
    return total_norm


def clip_scaled_grad_value_(parameters: Any, clip_value: float, scaler: Any) -> None:
    """``torch.nn.utils.clip_grad_value_`` for gradients still multiplied by the fp16 loss scale:
    each value is clamped to ``clip_value`` times the scale."""
    _, grads = _gradients(parameters)
    bounds: dict[torch.device, torch.Tensor] = {}
    for grad in grads:
        if grad.device not in bounds:
            bounds[grad.device] = _loss_scale(scaler, grad.device) * float(clip_value)
        grad.clamp_(min=-bounds[grad.device], max=bounds[grad.device])


def _to_fp32(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor


def convert_to_fp32(tensor: Any) -> Any:
    """Cast half-precision floating tensors (float16, bfloat16) in ``tensor`` (nested
    lists/tuples/dicts) to float32; other tensors and leaves are kept as they are."""
    return recursively_apply(_to_fp32, tensor)


def convert_outputs_to_fp32(model_forward: Callable[..., Any]) -> Callable[..., Any]:
    """``model_forward`` returning its half-precision outputs in float32 (see
    :func:`convert_to_fp32`)."""

    @functools.wraps(model_forward)
    def forward(*args: Any, **kwargs: Any) -> Any:
        return convert_to_fp32(model_forward(*args, **kwargs))

    return forward


def autocast_forward(
    forward: Callable[..., Any], mixed_precision: str, device: torch.device
) -> Callable[..., Any]:
    """``forward`` run under autocast, its floating outputs returned in fp32."""

    @functools.wraps(forward)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with autocast_context(mixed_precision, device):
            outputs = forward(*args, **kwargs)
        return convert_to_fp32(outputs)

    wrapped.__nb_accel_original_forward__ = forward  # type: ignore[attr-defined]
    return wrapped
