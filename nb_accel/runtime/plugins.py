"""Implementations found by name through the package metadata's entry points, rather than by an
import the registry writes: a registry asks for its group (``nb_accel.device_types``,
``nb_accel.device_backends``) and loads what an installed package declares there, so that
neither the registry nor the implementation imports the other back. nb_accel's own XLA support
is declared this way in ``pyproject.toml``, as another package's device type would be. The
mechanism is every registry's (``nb_accel/_registry.py``); the groups of the runtime's are here."""

from __future__ import annotations

from .._registry import declared, load_declared

__all__ = ["DEVICE_BACKENDS", "DEVICE_TYPES", "declared", "load_declared"]

#: The entry-point group of device types (``DeviceType`` subclasses, made without arguments).
DEVICE_TYPES = "nb_accel.device_types"
#: The entry-point group of device backends (what makes one from the state it serves: a
#: ``DeviceBackend`` subclass, or a function that imports it only then).
DEVICE_BACKENDS = "nb_accel.device_backends"
