"""Which device backend a worker uses: chosen once per state, from the environment.

A worker of a launch that runs on other devices than torch.distributed's names their backend
in ``NB_ACCEL_BACKEND`` (an XLA launch's workers: ``"xla"``). The backend is the one registered
under that name (:func:`register_device_backend`), else the one an installed package declares
under it in the ``nb_accel.device_backends`` entry points (nb_accel's XLA backend is declared
there: nothing here imports it by name). Every other worker, and a process outside any launch,
uses :class:`~.torch_distributed.TorchDistributedBackend`: the variable then names the process
group's backend (``"gloo"``, ``"nccl"``) or nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ..plugins import DEVICE_BACKENDS, load_declared
from .base import DeviceBackend, Rank
from .torch_distributed import TorchDistributedBackend

__all__ = ["BACKEND_VARIABLE", "register_device_backend", "named_device_backend", "choose"]

#: The environment variable that names a worker's backend.
BACKEND_VARIABLE = "NB_ACCEL_BACKEND"

_registered: dict[str, Callable[[Rank], DeviceBackend]] = {}


def register_device_backend(name: str, factory: Callable[[Rank], DeviceBackend]) -> None:
    """Make ``factory`` build the device backend of the workers whose ``NB_ACCEL_BACKEND`` is
    ``name`` (it is called with the state the backend serves)."""
    _registered[name] = factory


def named_device_backend() -> str | None:
    """The device backend this process's environment names, if one is registered or declared
    under that name (``None``: torch.distributed's)."""
    name = os.environ.get(BACKEND_VARIABLE)
    if name and name not in _registered:
        declared = load_declared(DEVICE_BACKENDS, name)  # a DeviceBackend subclass or factory
        if callable(declared):
            _registered[name] = declared
    return name if name in _registered else None


def choose(rank: Rank) -> DeviceBackend:
    """The device backend of the state ``rank`` (built once, when the state is)."""
    name = named_device_backend()
    return _registered[name](rank) if name is not None else TorchDistributedBackend(rank)
