"""Environment detection that never initialises CUDA (safe to call before a fork)."""

from __future__ import annotations

import functools
import os
import socket
import sys

from . import _cuda_fork

__all__ = [
    "cuda_device_count",
    "cuda_initialized",
    "cuda_works_after_fork",
    "default_start_method",
    "loopback_interface",
    "in_notebook",
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
    answer = _cuda_fork.ask_forked_child()
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
    (:func:`~nb_accel._cuda_fork.ask_forked_child`); a child that does not answer counts as
    ``False`` too. Call it only where CUDA devices exist.
    """
    if cuda_initialized():
        return False
    if not _cuda_fork.driver_loaded():
        return True
    answer = _cuda_fork.ask_forked_child()
    return answer is not None and not answer.bad_fork and answer.device_count != 0


def default_start_method() -> str:
    """``"fork"`` where it is safe and available (Linux), else ``"spawn"``."""
    return "fork" if sys.platform.startswith("linux") else "spawn"


@functools.lru_cache(maxsize=1)
def loopback_interface() -> str | None:
    """Name of the loopback network interface (``"lo"`` on Linux), or ``None`` if unknown."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    for name in names:
        if name == "lo" or name.startswith("lo"):
            return name
    return None


def in_notebook() -> bool:
    """True when running inside a Jupyter kernel (ipykernel), without importing IPython."""
    shell_module = sys.modules.get("IPython")
    if shell_module is None:
        return False
    get_ipython = getattr(shell_module, "get_ipython", None)
    shell = get_ipython() if get_ipython is not None else None
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})
