"""cloudpickle's search for a function's submodules, remembered while no module comes or goes.

Pickling a function by value, cloudpickle looks for the submodules of every package the
function's globals name (``concurrent.futures`` behind ``concurrent``) by reading all of
``sys.modules``, for every function, every time: in a kernel that imported torch, several
thousand names for each package, about 3.6 ms, most of what sending a warm command costs.

The answer depends only on the names the function's code uses, the packages among its
globals and the names in ``sys.modules``. :class:`SubmoduleMemo` keeps it for those, for
as long as ``sys.modules`` holds the same names (checked on every call);
:func:`remember_submodules` puts it in front of cloudpickle's own search, once per process.
"""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Callable, Iterable
from typing import Any

import cloudpickle

__all__ = ["CLOUDPICKLE_MODULE", "MEMO_ENTRIES", "SubmoduleMemo", "remember_submodules"]

#: cloudpickle's module that holds ``_find_imported_submodules`` and calls it by name.
CLOUDPICKLE_MODULE: types.ModuleType = sys.modules.get("cloudpickle.cloudpickle", cloudpickle)
#: Most answers kept; past this many, the memo starts again empty.
MEMO_ENTRIES = 512

#: A code object's names and the names of the packages among its globals.
_Key = tuple[tuple[str, ...], tuple[str, ...]]
Search = Callable[[types.CodeType, Iterable[Any]], list[types.ModuleType]]


class SubmoduleMemo:
    """cloudpickle's ``_find_imported_submodules(code, dependencies)``, answered from memory
    while ``sys.modules`` holds the names it held when the answer was found."""

    def __init__(self, search: Search) -> None:
        self.search = search
        self._modules: tuple[str, ...] = ()
        self._answers: dict[_Key, tuple[types.ModuleType, ...]] = {}
        self._lock = threading.Lock()

    def __call__(self, code: types.CodeType, dependencies: Iterable[Any]) -> list[types.ModuleType]:
        """The imported submodules of ``dependencies``' packages that ``code`` names."""
        packages = [
            dependency
            for dependency in dependencies
            if isinstance(dependency, types.ModuleType) and getattr(dependency, "__package__", None)
        ]
        if not packages:
            return []
        key = (code.co_names, tuple(package.__name__ for package in packages))
        modules = tuple(sys.modules)
        with self._lock:
            if modules != self._modules or len(self._answers) >= MEMO_ENTRIES:
                self._modules, self._answers = modules, {}
            found = self._answers.get(key)
        if found is None:
            found = tuple(self.search(code, packages))
            with self._lock:
                if modules == self._modules:
                    self._answers[key] = found
        return list(found)


def remember_submodules() -> SubmoduleMemo | None:
    """Put a :class:`SubmoduleMemo` in front of cloudpickle's submodule search (once per
    process); the memo, or None where this cloudpickle has no such search."""
    search = getattr(CLOUDPICKLE_MODULE, "_find_imported_submodules", None)
    if search is None or isinstance(search, SubmoduleMemo):
        return search
    memo = SubmoduleMemo(search)
    CLOUDPICKLE_MODULE._find_imported_submodules = memo  # type: ignore[attr-defined]
    return memo
