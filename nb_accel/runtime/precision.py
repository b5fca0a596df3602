"""Mixed precision: autocast contexts, the fp16 gradient scaler, fp32 model outputs."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import torch

from .tree import recursively_apply

__all__ = [
    "check_precision_for_device",
    "autocast_context",
    "make_grad_scaler",
    "convert_outputs_to_fp32",
    "autocast_forward",
]

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def check_precision_for_device(mixed_precision: str, device: torch.device) -> None:
    """Raise ``ValueError`` for a precision this device cannot run (fp16 off CUDA)."""
    if mixed_precision == "fp16" and device.type != "cuda":
        raise ValueError(
            f"mixed_precision='fp16' needs a CUDA GPU, but this process runs on {device.type}; "
            "use mixed_precision='bf16' on the CPU, or 'no'"
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
    """A ``GradScaler`` for fp16 on CUDA; ``None`` otherwise (bf16 needs none)."""
    if mixed_precision != "fp16":
        return None
    return torch.amp.GradScaler(device.type, **kwargs)


def _to_fp32(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor


def convert_outputs_to_fp32(value: Any) -> Any:
    """Cast half-precision floating tensors in ``value`` (nested lists/tuples/dicts) to fp32."""
    return recursively_apply(_to_fp32, value)


def autocast_forward(
    forward: Callable[..., Any], mixed_precision: str, device: torch.device
) -> Callable[..., Any]:
    """``forward`` run under autocast, its floating outputs returned in fp32."""

    @functools.wraps(forward)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with autocast_context(mixed_precision, device):
            outputs = forward(*args, **kwargs)
        return convert_outputs_to_fp32(outputs)

    wrapped.__nb_accel_original_forward__ = forward  # type: ignore[attr-defined]
    return wrapped
