"""Who initialised CUDA in this process: where the first call that can initialise it was made,
recorded from nb_accel's import on.

A kernel that initialised CUDA cannot fork workers that use it, and the notebook user wants to
know which line did it. torch initialises CUDA through ``torch.cuda._lazy_init`` (a tensor
created on a GPU reaches it from C++ by that name), and ``torch.cuda.is_available()`` and
``torch.cuda.device_count()`` initialise the driver on their own; each is wrapped here so that
its first call records the stack it was called from. Calls made before nb_accel was imported,
or through a reference taken before that, cannot be seen: :func:`first_cuda_call` is then
``None``.
"""

from __future__ import annotations

import functools
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["CudaCall", "first_cuda_call", "watch_cuda_initialisation"]

#: The functions of ``torch.cuda`` that can initialise CUDA.
WATCHED = ("_lazy_init", "is_available", "device_count")

#: Marks a wrapper installed here (installing twice wraps once).
_MARK = "_nb_accel_watched"


@dataclass(frozen=True)
class CudaCall:
    """The first call that could initialise CUDA.

    Attributes:
        function: what was called, in words (```torch.cuda.is_available()```, or ``the first
            use of CUDA`` for torch's lazy initialisation, which a tensor on a GPU reaches).
        stack: where from: ``(file, line, function)`` of each frame, outermost first.
    """

    function: str
    stack: tuple[tuple[str, int, str], ...]


_first: list[CudaCall] = []


def first_cuda_call() -> CudaCall | None:
    """The first call since nb_accel's import that could have initialised CUDA, if any."""
    return _first[0] if _first else None


def _watched(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not _first:
            frames = traceback.extract_stack(sys._getframe(1))
            stack = tuple((f.filename, f.lineno or 0, f.name) for f in frames)
            said = "the first use of CUDA" if name == "_lazy_init" else f"`torch.cuda.{name}()`"
            _first.append(CudaCall(said, stack))
        return original(*args, **kwargs)

    setattr(wrapper, _MARK, True)
    return wrapper


def watch_cuda_initialisation() -> None:
    """Record the first call of each function that can initialise CUDA (idempotent)."""
    import torch

    for name in WATCHED:
        original = getattr(torch.cuda, name, None)
        if original is None or getattr(original, _MARK, False):
            continue
        setattr(torch.cuda, name, _watched(name, original))
