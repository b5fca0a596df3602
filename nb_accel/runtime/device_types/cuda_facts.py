"""What this process can tell about CUDA without initialising it (safe before a fork): how many
GPUs are visible, whether CUDA is initialised here, and whether a forked worker could use it."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

from . import cuda_fork

__all__ = [
    "cuda_device_count",
    "cuda_initialized",
    "cuda_works_after_fork",
    "fork_safe_cuda_queries",
]


def cuda_device_count() -> int:
    """Number of visible CUDA devices, counted so that CUDA stays uninitialised in this process.

    NVML counts them where it can; where it cannot (MIG ids in ``CUDA_VISIBLE_DEVICES``, no
    ``libnvidia-ml``) the CUDA runtime counts them in a forked child, since asking it here
    would leave forked workers unable to use CUDA. Returns 0 when this torch build has no CUDA
    or no driver answers.
    """
    import torch

    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return 0
    counter = getattr(torch.cuda, "_device_count_nvml", None)
    count = counter() if counter is not None else -1
    return count if count >= 0 else _count_without_nvml()


def _count_without_nvml() -> int:
    import torch

    if cuda_initialized() or not hasattr(os, "fork"):  # nothing left to keep safe for a fork
        return int(torch.cuda.device_count())
    answer = cuda_fork.ask_forked_child()
    if answer is None:
        return 0
    if answer.bad_fork:  # this process initialised CUDA already: counting here costs nothing
        return int(torch.cuda.device_count())
    return max(answer.device_count, 0)


def cuda_initialized() -> bool:
    """True when torch says this process has initialised CUDA (``torch.cuda.is_initialized()``;
    see :func:`cuda_works_after_fork` for the cases it misses)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    return bool(torch.cuda.is_initialized())


def cuda_works_after_fork() -> bool:
    """True when a worker forked from this process now could use CUDA.

    ``False`` when this process initialised CUDA, also in the ways
    ``torch.cuda.is_initialized()`` does not see (``torch.cuda.is_available()``, another
    library): unless the CUDA driver library is not even loaded, a forked child is asked
    (:func:`~.cuda_fork.ask_forked_child`); a child that does not answer counts as ``False``
    too. Call it only where CUDA devices exist.
    """
    if cuda_initialized():
        return False
    if not cuda_fork.driver_loaded():
        return True
    answer = cuda_fork.ask_forked_child()
    return answer is not None and not answer.bad_fork and answer.device_count != 0


@contextlib.contextmanager
def fork_safe_cuda_queries() -> Iterator[None]:
    """Within it, torch's own code asking ``torch.cuda.is_available()`` or
    ``torch.cuda.device_count()`` in this process gets :func:`cuda_device_count`'s answer,
    which leaves CUDA uninitialised here (torch's ``LaunchConfig`` asks, for its NUMA
    binding, and a process that asked could fork no worker able to use CUDA). Where CUDA is
    initialised already, nothing is replaced."""
    import torch

    if cuda_initialized():
        yield
        return
    count = cuda_device_count()
    cuda = torch.cuda
    originals = cuda.is_available, cuda.device_count
    cuda.is_available, cuda.device_count = (lambda: count > 0), (lambda: count)
    try:
        yield
    finally:
        cuda.is_available, cuda.device_count = originals
