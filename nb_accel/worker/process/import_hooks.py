"""Adjust a module when it is loaded: at once if it already is, else right after its import.

A worker uses this to adapt a library that the launched function may import (🤗 Transformers'
Trainer) without importing the library itself. :func:`when_imported` runs its hook at once
when the module is in ``sys.modules`` (a worker forked from a kernel that had imported it);
otherwise a finder on ``sys.meta_path`` (there only while a hook waits) lends the one import
that loads the module a loader that runs the module's own loader, then the hooks. Once loaded,
the module and its spec hold their own loader again. A hook that fails is a warning, never an
error of the import.
"""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from importlib.abc import Loader, MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

__all__ = ["when_imported", "waiting_hooks"]

#: What runs on a module once it is loaded.
Hook = Callable[[ModuleType], None]

_hooks: dict[str, list[Hook]] = {}
_lock = threading.Lock()


def _run(hooks: list[Hook], module: ModuleType) -> None:
    for hook in hooks:
        try:
            hook(module)
        except Exception as error:  # noqa: BLE001 - the user's import must not fail for it
            warnings.warn(
                f"nb_accel could not adapt {module.__name__} to the launch "
                f"({type(error).__name__}: {error}); it runs as it would outside a launch",
                RuntimeWarning,
                stacklevel=2,
            )


class _HookedLoader(Loader):
    """The module's own loader, then its hooks; everything else is the loader's own."""

    def __init__(self, inner: Loader) -> None:
        self._inner = inner

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        """As the module's own loader does."""
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        """Run the module's code with its own loader, give it that loader back, then run the
        hooks waiting for it."""
        self._inner.exec_module(module)
        module.__loader__ = self._inner
        if module.__spec__ is not None:
            module.__spec__.loader = self._inner
        with _lock:
            hooks = _hooks.pop(module.__name__, [])
            if not _hooks and _FINDER in sys.meta_path:
                sys.meta_path.remove(_FINDER)
        _run(hooks, module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Finder(MetaPathFinder):
    """Finds a waited-for module with the other finders and lends its import a loader that
    runs the hooks."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        """The spec the other finders give, with a :class:`_HookedLoader` (``None`` for a
        module no hook waits for)."""
        if fullname not in _hooks:
            return None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is None:
                continue
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _HookedLoader(spec.loader)
            return spec  # type: ignore[no-any-return]
        return None


_FINDER = _Finder()


def when_imported(name: str, hook: Hook) -> None:
    """Run ``hook(module)`` once module ``name`` is loaded: now if it is, else right after the
    import that loads it (in this process; nothing is imported here)."""
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            _hooks.setdefault(name, []).append(hook)
            if _FINDER not in sys.meta_path:
                sys.meta_path.insert(0, _FINDER)
            return
    _run([hook], module)


def waiting_hooks() -> dict[str, int]:
    """How many hooks wait for each module not loaded yet (empty when none wait)."""
    with _lock:
        return {name: len(hooks) for name, hooks in _hooks.items()}
