"""Splitting a collection into one contiguous share per process."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["split_for_process"]


def _bounds(length: int, num_processes: int, index: int) -> tuple[int, int]:
    base, extra = divmod(length, num_processes)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


def _pad(share: Any, size: int) -> Any:
    if len(share) == 0 or len(share) >= size:
        return share
    missing = size - len(share)
    if isinstance(share, torch.Tensor):
        return torch.cat([share, share[-1:].repeat(missing, *([1] * (share.dim() - 1)))])
    return share + type(share)([share[-1]] * missing)


def split_for_process(inputs: Any, num_processes: int, index: int, apply_padding: bool) -> Any:
    """Process ``index``'s share of ``inputs`` (list, tuple, tensor, or dict of those)."""
    if isinstance(inputs, dict):
        lengths = {len(v) for v in inputs.values()}
        if len(lengths) > 1:
            raise ValueError(
                "split_between_processes needs every value of the dict to be the same length"
            )
        return {
            k: split_for_process(v, num_processes, index, apply_padding) for k, v in inputs.items()
        }
    if not hasattr(inputs, "__len__") or not hasattr(inputs, "__getitem__"):
        raise TypeError(
            f"split_between_processes cannot split a {type(inputs).__name__}; "
            "pass a list, tuple, tensor or dict of those"
        )
    start, end = _bounds(len(inputs), num_processes, index)
    share = inputs[start:end]
    if apply_padding:
        share = _pad(share, -(-len(inputs) // num_processes))
    return share
