"""``find_executable_batch_size``: retry a function with a smaller batch after running out of
memory, as Accelerate's decorator of that name does."""

from __future__ import annotations

import functools
import gc
import inspect
from collections.abc import Callable
from typing import Any

import torch

from .device_types import device_types

__all__ = ["find_executable_batch_size", "release_memory", "should_reduce_batch_size"]

#: Messages of the errors a smaller batch may cure (device or CPU out of memory, cuDNN).
_OUT_OF_MEMORY = (
    " out of memory.",
    "MPS backend out of memory",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
    "DefaultCPUAllocator: can't allocate memory",
    "FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed",
)


def should_reduce_batch_size(exception: BaseException) -> bool:
    """True when ``exception`` says memory ran out (``torch.OutOfMemoryError`` or a
    ``RuntimeError`` with an out-of-memory message), so that a smaller batch may fit."""
    if isinstance(exception, torch.OutOfMemoryError):
        return True
    if isinstance(exception, RuntimeError) and len(exception.args) == 1:
        return any(text in str(exception.args[0]) for text in _OUT_OF_MEMORY)
    return False


def _free_cached_memory() -> None:
    gc.collect()
    for device in device_types():  # each empties its own cache, if it has one in use
        device.empty_cache()


def release_memory(*objects: Any) -> list[None]:
    """Drop these references and free cached device memory; returns a list of ``None`` to
    assign back: ``model, optimizer = release_memory(model, optimizer)``."""
    released: list[None] = [None for _ in objects]
    del objects
    _free_cached_memory()
    return released


def find_executable_batch_size(
    function: Callable[..., Any] | None = None,
    starting_batch_size: int = 128,
    reduce_batch_size_fn: Callable[[], int] | None = None,
) -> Any:
    """Decorator: call ``function(batch_size, *args, **kwargs)`` from ``starting_batch_size``
    down, until a call finishes without running out of memory.

    After an out-of-memory error (see :func:`should_reduce_batch_size`) the cached memory is
    freed and the batch size becomes ``int(batch_size * 0.9)`` (or ``reduce_batch_size_fn()``);
    other exceptions propagate. The size reached is kept for the next call. Call the decorated
    function without the batch size: ``train(model)`` for ``def train(batch_size, model)``.

    Raises:
        RuntimeError: when the batch size reaches zero.
        TypeError: when the caller passes the batch size itself.
    """
    if function is None:
        return functools.partial(
            find_executable_batch_size,
            starting_batch_size=starting_batch_size,
            reduce_batch_size_fn=reduce_batch_size_fn,
        )
    batch_size = starting_batch_size

    def smaller() -> int:
        return reduce_batch_size_fn() if reduce_batch_size_fn is not None else int(batch_size * 0.9)

    @functools.wraps(function)
    def decorated(*args: Any, **kwargs: Any) -> Any:
        nonlocal batch_size
        parameters = list(inspect.signature(function).parameters)
        if len(parameters) < len(args) + 1:
            raise TypeError(
                f"{function.__name__} was called with its batch size as first argument; "
                "find_executable_batch_size passes it: leave it out of the call"
            )
        _free_cached_memory()
        while True:
            if batch_size <= 0:
                raise RuntimeError(
                    f"{function.__name__} ran out of memory at every batch size down to 1 "
                    f"(from {starting_batch_size}): free memory or make each sample smaller"
                )
            try:
                return function(batch_size, *args, **kwargs)
            except Exception as exc:
                if not should_reduce_batch_size(exc):
                    raise
                del exc  # its traceback holds the failed call's tensors
                _free_cached_memory()
                batch_size = smaller()

    return decorated
