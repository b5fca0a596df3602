"""One shape for every kind of plug-in: launch backends, device types, device backends,
sharding strategies, trackers and launch views are each a :class:`Registry` of items by name.

A registry's items come from four places, asked in this order: those registered at run time
(newest first), those the kernel registered and named in a spawned worker's environment
(:data:`REGISTERED_VARIABLE`), those installed packages declare as entry points of the
registry's group (loaded by name: neither side imports the other), and the built-in ones
(which may be given as ``"module:attr"`` strings, imported on first use). Everything but the
registered items goes once through the registry's ``load`` (a check, or making an instance).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Generic, TypeVar, cast

__all__ = [
    "REGISTERED_VARIABLE",
    "Registry",
    "UnknownNameError",
    "declared",
    "dotted_name",
    "load_declared",
    "load_dotted",
    "registered_env",
]

T = TypeVar("T")

#: The variable a launch sets in its ranks: the items the kernel registered that a worker can
#: import, as JSON (``{group: {name: "module:qualname"}}``), for workers that do not inherit
#: the kernel's memory (spawned ones, other hosts).
REGISTERED_VARIABLE = "NB_ACCEL_REGISTERED"


class UnknownNameError(KeyError, ValueError):
    """A registry was asked for a name nothing is registered, declared or built in as (a
    ``ValueError``, and a ``KeyError`` for the registries read as mappings)."""

    def __str__(self) -> str:
        """The message itself (a ``KeyError`` would show its quoted repr)."""
        return str(self.args[0]) if self.args else ""


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


def load_dotted(where: str) -> object:
    """What ``where`` (``"module:qualname"``) names, its module imported."""
    module, _, qualname = where.partition(":")
    found: object = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def dotted_name(item: object) -> str | None:
    """``"module:qualname"`` of ``item`` (of its class, for an instance) when another process
    can import it back from there; ``None`` for a lambda, a local class or one of ``__main__``."""
    target = item if inspect.isclass(item) or inspect.isfunction(item) else type(item)
    module = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", "")
    if not module or module == "__main__" or "<" in qualname:
        return None
    found: object = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return f"{module}:{qualname}" if found is target else None


def _environment_entries(group: str) -> dict[str, str]:
    """The items of ``group`` the kernel named in this process's environment."""
    text = os.environ.get(REGISTERED_VARIABLE)
    return _parsed(text).get(group, {}) if text else {}


@functools.cache
def _parsed(text: str) -> dict[str, dict[str, str]]:
    try:
        found = json.loads(text)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


_IN_WORKERS: list[Registry[Any]] = []


def registered_env() -> dict[str, str]:
    """What a launch sets in its ranks so that a worker which did not inherit this process's
    registrations finds them by name: :data:`REGISTERED_VARIABLE` (nothing when none can be
    imported elsewhere)."""
    found = {r.group: r.exported() for r in _IN_WORKERS if r.group is not None and r.exported()}
    return {REGISTERED_VARIABLE: json.dumps(found, sort_keys=True)} if found else {}


class Registry(Mapping[str, T], Generic[T]):
    """The items of one kind of plug-in, by name, read as a mapping in the order they are asked:
    registered (newest first), named by the kernel in the environment, declared by installed
    packages (the entry points of ``group``), built in.

    Args:
        kind: what an item is, in messages (``"device type"``).
        plural: the same, of several (None: ``kind`` and an ``s``).
        built_in: the items nb_accel brings, in order; a value may be a ``"module:attr"``
            string, imported when the item is first asked for.
        group: the entry-point group installed packages declare items in (None: none).
        load: what turns a built-in, declared or environment's value into an item (a check,
            or an instance made), given the name and the value; it may be a ``"module:attr"``
            string too. None: the value as it is.
        in_workers: True when the workers ask for items by name, so that a launch names the
            kernel's registered items in its ranks' environment (:func:`registered_env`).
    """

    def __init__(
        self,
        kind: str,
        *,
        plural: str | None = None,
        built_in: Mapping[str, object] | None = None,
        group: str | None = None,
        load: Callable[[str, object], T] | str | None = None,
        in_workers: bool = False,
    ) -> None:
        self.kind = kind
        self.plural = plural or f"{kind}s"
        self.group = group
        self._built_in: dict[str, object] = dict(built_in or {})
        self._load = load
        self._registered: dict[str, T] = {}  # oldest first
        self._loaded: dict[tuple[str, str, str], T] = {}  # (source, name, where) -> item
        if in_workers:
            _IN_WORKERS.append(self)

    __eq__ = object.__eq__  # a registry is itself: comparing would load every item
    __hash__ = object.__hash__

    def register(self, name: str, item: T) -> None:
        """Make ``item`` the one named ``name``, asked before every other."""
        self._registered.pop(name, None)
        self._registered[name] = item

    def unregister(self, name: str) -> None:
        """Forget what :meth:`register` put under ``name`` (a declared or built-in item of that
        name is asked for again); nothing when nothing was."""
        self._registered.pop(name, None)

    def registered(self) -> dict[str, T]:
        """The items registered at run time, newest first."""
        return dict(reversed(self._registered.items()))

    def built_in(self) -> list[str]:
        """The names of the built-in items, in order."""
        return list(self._built_in)

    def names(self) -> list[str]:
        """Every name, in the order the items are asked: registered (newest first), named in
        the environment, declared, built in."""
        declared_names = declared(self.group) if self.group else {}
        return list(
            dict.fromkeys(
                [
                    *reversed(self._registered),
                    *(_environment_entries(self.group) if self.group else {}),
                    *declared_names,
                    *self._built_in,
                ]
            )
        )

    def exported(self) -> dict[str, str]:
        """The registered items another process can import, as ``name: "module:qualname"``."""
        found = {name: dotted_name(item) for name, item in self.registered().items()}
        return {name: where for name, where in found.items() if where is not None}

    def _loaded_item(self, source: str, name: str, value: object) -> T:
        key = (source, name, value if isinstance(value, str) else "")
        if key not in self._loaded:
            if source == "declared":  # an entry point (whichever metadata library made it)
                value = cast(EntryPoint, value).load()
            elif isinstance(value, str):
                value = load_dotted(value)
            load = self._load
            if isinstance(load, str):
                load = self._load = cast(Callable[[str, object], T], load_dotted(load))
            self._loaded[key] = load(name, value) if load is not None else cast(T, value)
        return self._loaded[key]

    def _from_environment(self, entry: tuple[str, str]) -> T:
        name, where = entry  # the name given to the registry, where the kernel found the item
        try:
            return self._loaded_item("environment", name, where)
        except (ImportError, AttributeError, TypeError) as error:
            raise ImportError(
                f"the kernel registered the {self.kind} {name!r} as {where}, which this worker "
                f"cannot import or make ({error}): define it in a module the workers can "
                "import (an instance: of a class made without arguments), or launch with "
                "start_method='fork'"
            ) from error

    def _find(self, name: str) -> T | None:
        if name in self._registered:
            return self._registered[name]
        if self.group is not None:
            where = _environment_entries(self.group).get(name)
            if where is not None:
                return self._from_environment((name, where))
            if name in declared(self.group):
                return self._loaded_item("declared", name, declared(self.group)[name])
        if name in self._built_in:
            return self._loaded_item("built-in", name, self._built_in[name])
        return None

    def __getitem__(self, name: str) -> T:
        """The item named ``name``; an :class:`UnknownNameError` naming the others if none is."""
        found = self._find(name)
        if found is None:
            known = ", ".join(repr(n) for n in self.names())
            raise UnknownNameError(
                f"no {self.kind} is named {name!r}; the {self.plural} are {known}"
            )
        return found

    def get(self, name: str, default: Any = None) -> Any:
        """The item named ``name``, else ``default``."""
        found = self._find(name) if isinstance(name, str) else None
        return default if found is None else found

    def __contains__(self, name: object) -> bool:
        """True when an item is named ``name`` (nothing is loaded to tell)."""
        return isinstance(name, str) and name in self.names()

    def __iter__(self) -> Iterator[str]:
        """The names, in the order the items are asked."""
        return iter(self.names())

    def __len__(self) -> int:
        """How many names there are."""
        return len(self.names())

    def __setitem__(self, name: str, item: T) -> None:
        """:meth:`register`."""
        self.register(name, item)

    def __delitem__(self, name: str) -> None:
        """:meth:`unregister`; a ``KeyError`` when nothing is registered as ``name``."""
        del self._registered[name]

    def __repr__(self) -> str:
        """The kind and the names."""
        return f"<Registry of {self.plural}: {', '.join(self.names())}>"
