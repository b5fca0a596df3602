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

from ..._registry import Registry
from ..plugins import DEVICE_BACKENDS
from .base import DeviceBackend, Rank
from .torch_distributed import TorchDistributedBackend

__all__ = [
    "BACKEND_VARIABLE",
    "DEVICE_BACKEND_REGISTRY",
    "register_device_backend",
    "unregister_device_backend",
    "named_device_backend",
    "choose",
]

#: The environment variable that names a worker's backend.
BACKEND_VARIABLE = "NB_ACCEL_BACKEND"

#: What a backend is made by.
Factory = Callable[[Rank], DeviceBackend]


def _factory(name: str, found: object) -> Factory:
    """A declared backend: what makes it (a ``DeviceBackend`` subclass or a function)."""
    if not callable(found):
        raise TypeError(f"device backend {name!r}: {found!r} cannot make a backend")
    return found


#: The device backends by name: registered, declared (``nb_accel.device_backends`` entry points,
#: XLA's among them); torch.distributed's serves every other name.
DEVICE_BACKEND_REGISTRY: Registry[Factory] = Registry(
    "device backend", group=DEVICE_BACKENDS, load=_factory, in_workers=True
)


def register_device_backend(name: str, factory: Factory) -> None:
    """Make ``factory`` build the device backend of the workers whose ``NB_ACCEL_BACKEND`` is
    ``name`` (it is called with the state the backend serves)."""
    DEVICE_BACKEND_REGISTRY.register(name, factory)


def unregister_device_backend(name: str) -> None:
    """Forget the backend :func:`register_device_backend` put under ``name``."""
    DEVICE_BACKEND_REGISTRY.unregister(name)


def named_device_backend() -> str | None:
    """The device backend this process's environment names, if one is registered or declared
    under that name (``None``: torch.distributed's)."""
    name = os.environ.get(BACKEND_VARIABLE)
    return name if name and name in DEVICE_BACKEND_REGISTRY else None


def choose(rank: Rank) -> DeviceBackend:
    """The device backend of the state ``rank`` (built once, when the state is)."""
    name = named_device_backend()
    if name is None:
        return TorchDistributedBackend(rank)
    return DEVICE_BACKEND_REGISTRY[name](rank)
