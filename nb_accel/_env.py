"""Environment detection that never initialises CUDA (safe to call before a fork)."""

from __future__ import annotations

import functools
import os
import socket
import sys

__all__ = [
    "cuda_device_count",
    "cuda_initialized",
    "default_start_method",
    "loopback_interface",
    "in_notebook",
]


def cuda_device_count() -> int:
    """Number of visible CUDA devices, counted through NVML so that CUDA stays uninitialised.

    Returns 0 when this torch build has no CUDA or no driver answers.
    """
    import torch

    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return 0
    counter = getattr(torch.cuda, "_device_count_nvml", None)
    count = counter() if counter is not None else -1
    if count < 0:
        # NVML unavailable: ask the runtime in a way torch documents as fork-safe.
        previous = os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK")
        os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
        try:
            count = int(torch.cuda.is_available() and torch.cuda.device_count())
        finally:
            if previous is None:
                os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
            else:
                os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = previous
    return max(count, 0)


def cuda_initialized() -> bool:
    """True when this process has already initialised CUDA (forked children could not use it)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    return bool(torch.cuda.is_initialized())


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
