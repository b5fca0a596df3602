"""Facts about the environment that touch no device (safe to call before a fork): the default
start method and whether autograd's threads still allow a fork, the loopback interface, whether
this is a notebook kernel. What CUDA looks like
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
    "AUTOGRAD_THREAD_PREFIX",
    "autograd_threads_started",
    "ray_connected",
    "loopback_interface",
    "in_notebook",
    "text_view_asked",
    "VIEW_VARIABLE",
    "TORCH_FLOOR",
    "check_torch",
    "torch_problem",
]


#: The name torch gives each of its autograd engine's device threads, before the device index.
#: At the first backward pass the engine starts one per device of a kind other than the CPU
#: that torch counts; from then on a child forked from the process cannot run a backward pass
#: ("Unable to handle autograd's threading in combination with fork-based multiprocessing"). A
#: CUDA build of torch starts them after ``torch.compile`` even on a machine without GPUs
#: (Colab's CPU runtime).
AUTOGRAD_THREAD_PREFIX = "pt_autograd_"


def autograd_threads_started() -> bool:
    """True when a thread of this process is one of autograd's device threads, read from the
    threads' names (touching nothing of torch's); False where they cannot be listed (not
    Linux)."""
    try:
        threads = os.listdir("/proc/self/task")
    except OSError:
        return False
    for thread in threads:
        try:
            with open(f"/proc/self/task/{thread}/comm") as comm:
                if comm.read().startswith(AUTOGRAD_THREAD_PREFIX):
                    return True
        except OSError:  # the thread ended meanwhile
            continue
    return False


def ray_connected() -> bool:
    """True when this process is connected to a Ray cluster (``ray.init`` ran here, by the
    user or by a launch on Ray), read from the module already loaded: Ray is never imported
    for the question. A child forked from such a process breaks the connection it shares with
    Ray's node (Ray does not support ``fork`` after ``ray.init``)."""
    ray = sys.modules.get("ray")
    is_initialized = getattr(ray, "is_initialized", None)
    return bool(callable(is_initialized) and is_initialized())


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
