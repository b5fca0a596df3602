"""The user's own modules on warm workers kept as fresh as in the kernel: a module imported
from outside the Python installation and its packages (a ``.py`` file of the project) whose
file changed since this worker loaded it is reloaded before the next launch runs, as
IPython's ``%autoreload`` does in the kernel. A function pickled by reference to such a module
would otherwise run its old code."""

from __future__ import annotations

import importlib
import os
import sys
import sysconfig
from types import ModuleType

__all__ = ["StaleModuleError", "note_new_modules", "reload_changed_modules"]

#: Where the installation's modules live: never the user's own.
_LIBRARIES = tuple(
    os.path.realpath(path) + os.sep
    for path in {
        sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")
    }
    | {os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))}
)

#: Each user module's file and its modification time when this worker last loaded it.
_loaded: dict[str, tuple[str, int]] = {}


class StaleModuleError(ImportError):
    """A module of the user's own changed on disk and could not be reloaded in a worker."""


def _own_file(module: ModuleType) -> str | None:
    file = getattr(module, "__file__", None)
    if not isinstance(file, str) or not file.endswith(".py"):
        return None
    path = os.path.realpath(file)
    return None if path.startswith(_LIBRARIES) else path


def reload_changed_modules() -> list[str]:
    """Reload the user's modules whose file changed since this worker loaded them; their
    names. Modules seen for the first time are noted as they are.

    Raises:
        StaleModuleError: a changed module failed to reload (its error is the cause).
    """
    reloaded = []
    for name, module in list(sys.modules.items()):
        path = _own_file(module) if module is not None else None
        if path is None:
            continue
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:  # removed since: nothing newer to load
            continue
        seen = _loaded.get(name)
        if seen is not None and seen != (path, mtime):
            try:
                importlib.reload(module)
            except Exception as error:
                raise StaleModuleError(
                    f"{name} ({path}) changed since this worker imported it, and reloading it "
                    f"failed: {type(error).__name__}: {error}. Fix the module, or "
                    "nb_accel.stop_workers() to start fresh workers"
                ) from error
            reloaded.append(name)
        _loaded[name] = (path, mtime)
    return reloaded


def note_new_modules() -> None:
    """Note the user's modules this worker loaded since the last look, as they are now (after
    a launch, the modules its function imported; at the start, those inherited)."""
    for name, module in list(sys.modules.items()):
        path = _own_file(module) if module is not None and name not in _loaded else None
        if path is not None:
            try:
                _loaded[name] = (path, os.stat(path).st_mtime_ns)
            except OSError:
                continue
