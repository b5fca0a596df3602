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


#: The names of ``sys.modules`` already looked at (only new names are looked at: resolving
#: every module's path at each launch would cost more than the launch).
_checked: set[str] = set()
#: ``sys.modules``' names at the last look.
_last_seen: tuple[str, ...] = ()


def _own_file(module: ModuleType) -> str | None:
    file = getattr(module, "__file__", None)
    if not isinstance(file, str) or not file.endswith(".py"):
        return None
    path = os.path.realpath(file)
    return None if path.startswith(_LIBRARIES) else path


def note_new_modules() -> None:
    """Note the user's modules this worker loaded since the last look, as they are now (after
    a launch, the modules its function imported; at the start, those inherited)."""
    global _last_seen  # noqa: PLW0603 - one worker, one sys.modules
    names = tuple(sys.modules)
    if names == _last_seen:  # no module came or went since the last look
        return
    _last_seen = names
    for name in sys.modules.keys() - _checked:
        _checked.add(name)
        module = sys.modules.get(name)
        path = _own_file(module) if module is not None else None
        if path is not None:
            try:
                _loaded[name] = (path, os.stat(path).st_mtime_ns)
            except OSError:
                continue


def reload_changed_modules() -> list[str]:
    """Reload the user's modules whose file changed since this worker loaded them; their
    names. Modules seen for the first time are noted as they are.

    Raises:
        StaleModuleError: a changed module failed to reload (its error is the cause).
    """
    reloaded = []
    for name, (path, mtime) in list(_loaded.items()):
        module = sys.modules.get(name)
        if module is None:  # forgotten since: imported afresh when asked again
            del _loaded[name]
            _checked.discard(name)
            continue
        try:
            now = os.stat(path).st_mtime_ns
        except OSError:  # removed since: nothing newer to load
            continue
        if now == mtime:
            continue
        try:
            importlib.reload(module)
        except Exception as error:
            raise StaleModuleError(
                f"{name} ({path}) changed since this worker imported it, and reloading it "
                f"failed: {type(error).__name__}: {error}. Fix the module, or "
                "nb_accel.stop_workers() to start fresh workers"
            ) from error
        _loaded[name] = (path, now)
        reloaded.append(name)
    note_new_modules()
    return reloaded
