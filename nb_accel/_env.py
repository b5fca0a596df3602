"""Facts about the environment that touch no device (safe to call before a fork): the default
start method, the loopback interface, whether this is a notebook kernel. What CUDA looks like
is the CUDA device type's (``runtime/device_types/cuda_facts.py``)."""

from __future__ import annotations

import functools
import os
import socket
import sys

__all__ = [
    "default_start_method",
    "loopback_interface",
    "in_notebook",
    "text_view_asked",
    "VIEW_VARIABLE",
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
