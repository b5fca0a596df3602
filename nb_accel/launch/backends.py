"""The launch backends, and the one place a launch's backend is chosen.

Each backend is a :class:`~.launchers.backend.LaunchBackend` subclass; :func:`backend_for`
asks them in order whether they run a spec, and the first that does runs it. A new backend is
its module and one :func:`register_launch_backend` call (or one line in :data:`BUILT_IN`);
registered backends are asked before the built-in ones.
"""

from __future__ import annotations

from typing import Any

from .._registry import Registry
from .debugging.kept_rank import release_kept_rank
from .hosts.launcher import HostsLauncher
from .launchers.backend import LaunchBackend
from .launchers.interface import run_launch
from .multinode.launcher import NodesLauncher
from .request import LaunchCall
from .single_node import SingleNodeLauncher
from .spec import LaunchSpec
from .warm.backend import WarmLauncher
from .xla.launcher import XlaLauncher

__all__ = [
    "BUILT_IN",
    "LAUNCH_BACKENDS",
    "backend_for",
    "launch",
    "launch_backends",
    "register_launch_backend",
    "unregister_launch_backend",
]

#: The backends nb_accel brings, in the order they are asked: the kernel's warm workers, the
#: devices' own (XLA's), hosts driven from this kernel, nodes of a multi-node launch, this
#: machine's processes.
BUILT_IN: tuple[type[LaunchBackend], ...] = (
    WarmLauncher,
    XlaLauncher,
    HostsLauncher,
    NodesLauncher,
    SingleNodeLauncher,
)


def _backend(name: str, found: object) -> type[LaunchBackend]:
    """The backend ``found``, checked (``name``: what it is registered or declared as)."""
    del name
    if not (isinstance(found, type) and issubclass(found, LaunchBackend)):
        raise TypeError(f"{found!r} is not a LaunchBackend subclass")
    return found


#: Every backend by name, in the order they are asked: registered (newest first), declared by
#: installed packages (``nb_accel.launch_backends`` entry points), :data:`BUILT_IN`.
LAUNCH_BACKENDS: Registry[type[LaunchBackend]] = Registry(
    "launch backend",
    built_in={backend.name: backend for backend in BUILT_IN},
    group="nb_accel.launch_backends",
    load=_backend,
)


def register_launch_backend(backend: type[LaunchBackend]) -> None:
    """Make ``backend`` a way of running launches: asked whether it runs a spec before the
    backends registered earlier and the built-in ones."""
    checked = _backend("", backend)
    LAUNCH_BACKENDS.register(checked.name, checked)


def unregister_launch_backend(backend: type[LaunchBackend]) -> None:
    """Forget a backend :func:`register_launch_backend` added (the built-in ones stay)."""
    for name, registered in LAUNCH_BACKENDS.registered().items():
        if registered is backend:
            LAUNCH_BACKENDS.unregister(name)


def launch_backends() -> list[type[LaunchBackend]]:
    """Every backend, in the order they are asked."""
    return list(LAUNCH_BACKENDS.values())


def backend_for(spec: LaunchSpec) -> type[LaunchBackend]:
    """The backend that runs ``spec``: the first that says it does."""
    for backend in launch_backends():
        if backend.runs(spec):
            return backend
    raise LookupError(
        f"no launch backend runs launches on {spec.device.label}s: they need the backend "
        f"{spec.device.launcher!r}, which is not registered"
    )


def launch(spec: LaunchSpec, call: LaunchCall) -> Any:
    """Run ``call`` as ``spec`` says, on the backend chosen for it; the results in rank order,
    or the exception to raise. Whatever ends it, nothing it started is left behind (but the
    rank kept for ``%debug`` when it fails, which the next launch releases)."""
    release_kept_rank()  # the last failure's rank, kept for %debug
    return run_launch(backend_for(spec)(spec, call))
