"""The XLA (TPU) path: everything that imports ``torch_xla``.

The XLA device type (:mod:`.device_type`) and device backend (:mod:`.backend`) are declared as
``nb_accel.device_types`` and ``nb_accel.device_backends`` entry points (``pyproject.toml``):
the registries load them by that name when a launch, or a worker, asks for XLA, and nothing
outside this folder imports it. ``torch_xla`` itself loads only when a launch asks for XLA
devices, or a state builds the backend.
"""

from __future__ import annotations

from ..device_backends.base import DeviceBackend, Rank

__all__ = ["xla_backend"]


def xla_backend(rank: Rank) -> DeviceBackend:
    """The XLA device backend of the state ``rank`` (``torch_xla`` is loaded here, when a state
    builds it, not when the backend is found): the entry point the registry loads."""
    from .backend import XlaBackend

    return XlaBackend(rank)
