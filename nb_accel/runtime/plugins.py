"""Implementations found by name through the package metadata's entry points, rather than by an
import the registry writes: a registry asks for its group (``nb_accel.device_types``,
``nb_accel.device_backends``) and loads what an installed package declares there, so that
neither the registry nor the implementation imports the other back. nb_accel's own XLA support
is declared this way in ``pyproject.toml``, as another package's device type would be."""

from __future__ import annotations

import functools
from importlib.metadata import EntryPoint, entry_points

__all__ = ["DEVICE_BACKENDS", "DEVICE_TYPES", "declared", "load_declared"]

#: The entry-point group of device types (``DeviceType`` subclasses, made without arguments).
DEVICE_TYPES = "nb_accel.device_types"
#: The entry-point group of device backends (what makes one from the state it serves: a
#: ``DeviceBackend`` subclass, or a function that imports it only then).
DEVICE_BACKENDS = "nb_accel.device_backends"


@functools.cache
def declared(group: str) -> dict[str, EntryPoint]:
    """The entry points of ``group`` that the installed packages declare, by name (read once
    per process: the metadata of every installed package is scanned)."""
    return {point.name: point for point in entry_points(group=group)}


def load_declared(group: str, name: str) -> object | None:
    """What the entry point ``name`` of ``group`` names, loaded (its module imported); ``None``
    when no installed package declares it."""
    point = declared(group).get(name)
    return None if point is None else point.load()
