"""Facts about the environment that touch no device (safe to call before a fork): the default
start method, the loopback interface, whether this is a notebook kernel. What CUDA looks like
is the CUDA device type's (``runtime/device_types/cuda_facts.py``)."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import re
import socket
import sys

__all__ = [
    "default_start_method",
    "loopback_interface",
    "in_notebook",
    "text_view_asked",
    "VIEW_VARIABLE",
    "TORCH_FLOOR",
    "check_torch",
    "torch_problem",
]


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


#: ``NB_ACCEL_VIEW=text``: the text view also in a notebook, for a front end without a widget
#: manager (it shows a widget as its one-line title).
VIEW_VARIABLE = "NB_ACCEL_VIEW"


def text_view_asked() -> bool:
    """Whether ``NB_ACCEL_VIEW=text`` asks for the text view in a notebook too."""
    return os.environ.get(VIEW_VARIABLE, "").strip().lower() == "text"


# -- the oldest torch ----------------------------------------------------------------------------
# nb_accel is tested on torch 2.9 (Colab's TPU runtime) to the newest release. An older torch
# lacks what it is built on: FSDP2's public ``fully_shard``, the public DTensor and device-mesh
# APIs that tensor parallelism and HSDP use, ``torch.distributed.checkpoint``'s state-dict
# helpers, and the process-group abort that frees ranks waiting on a failed one. Rather than fail
# later, inside a worker, with an ``AttributeError`` about one of them, the import says what to do.

#: The oldest (major, minor) release of torch that nb_accel supports.
TORCH_FLOOR = (2, 9)


def torch_problem(version: str) -> str | None:
    """What is wrong with torch ``version`` (``"2.8.0+cu126"``) for nb_accel, or ``None``."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None or (int(found.group(1)), int(found.group(2))) >= TORCH_FLOOR:
        return None
    floor = ".".join(map(str, TORCH_FLOOR))
    return (
        f"nb_accel needs torch {floor} or newer, and this environment has torch {version}. "
        f"Upgrade it (pip install -U 'torch>={floor}'; on Colab and Kaggle the runtimes' own "
        "torch is recent enough), then restart the kernel."
    )


def check_torch() -> None:
    """Raise ``ImportError`` (saying what to do) when the installed torch is too old."""
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return  # torch itself will say it is missing, on first use
    problem = torch_problem(version)
    if problem is not None:
        raise ImportError(problem)
