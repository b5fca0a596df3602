"""Which device backend a worker uses: chosen once per state, from the environment.

A worker of a launch that runs on other devices than torch.distributed's names their backend
in ``NB_ACCEL_BACKEND`` (an XLA launch's workers: ``"xla"``), and the package that implements
it registers it under that name when it is loaded (``nb_accel.runtime.xla`` registers the XLA
backend; the launch that starts such workers loads it, and so does this module, by name, when
a worker names the backend before anything loaded its package). Every other worker, and a process
outside any launch, uses :class:`~.torch_distributed.TorchDistributedBackend`: the variable
then names the process group's backend (``"gloo"``, ``"nccl"``) or nothing.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable

from .base import DeviceBackend, Rank
from .torch_distributed import TorchDistributedBackend

__all__ = ["BACKEND_VARIABLE", "register_device_backend", "named_device_backend", "choose"]

#: The environment variable that names a worker's backend.
BACKEND_VARIABLE = "NB_ACCEL_BACKEND"

_registered: dict[str, Callable[[Rank], DeviceBackend]] = {}

#: The packages that register a backend when loaded, by the name their workers have in
#: ``NB_ACCEL_BACKEND``: loaded here when a worker names one and nothing loaded it yet.
_PACKAGES = {"xla": "nb_accel.runtime.xla"}


def register_device_backend(name: str, factory: Callable[[Rank], DeviceBackend]) -> None:
    """Make ``factory`` build the device backend of the workers whose ``NB_ACCEL_BACKEND`` is
    ``name`` (it is called with the state the backend serves)."""
    _registered[name] = factory


def named_device_backend() -> str | None:
    """The registered device backend this process's environment names, if any (``None``:
    torch.distributed's)."""
    name = os.environ.get(BACKEND_VARIABLE)
    if name in _PACKAGES and name not in _registered:
        importlib.import_module(_PACKAGES[name])  # registers it
    return name if name in _registered else None


def choose(rank: Rank) -> DeviceBackend:
    """The device backend of the state ``rank`` (built once, when the state is)."""
    name = named_device_backend()
    return _registered[name](rank) if name is not None else TorchDistributedBackend(rank)
