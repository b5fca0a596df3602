"""Objects a worker keeps from one launch to the next: ``resident(name, build)``.

On warm workers (``notebook_launcher(..., reuse_workers=True)`` and the ``%%distributed``
pool, which are the same workers) a resident outlives the launch or cell that built it: the
model the first launch loaded is there for the second. In a ``%%distributed`` namespace it is
also the variable ``name``. In a cold launch it lives as long as the launch's workers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["bind_namespace", "drop_resident", "resident", "resident_names"]

_T = TypeVar("_T")

_kept: dict[str, Any] = {}
#: The ``%%distributed`` namespace of this worker, where residents are variables too.
_namespace: dict[str, Any] | None = None


def bind_namespace(namespace: dict[str, Any] | None) -> None:
    """Make every resident a variable of ``namespace`` as well (the pool's worker does)."""
    global _namespace  # noqa: PLW0603 - one namespace per worker process
    _namespace = namespace
    if namespace is not None:
        namespace.update(_kept)


def resident(name: str, build: Callable[[], _T]) -> _T:
    """The object this worker keeps under ``name``: ``build()``'s value, built the first time
    only and kept for the launches and cells that follow on the same workers.

    Args:
        name: what the object is kept under (also its variable name in ``%%distributed``).
        build: makes the object; called on the first use of ``name`` in this worker.

    Raises:
        TypeError: ``name`` is not a non-empty string, or ``build`` is not callable.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"resident() takes a name (a non-empty str) first, got {name!r}")
    if not callable(build):
        raise TypeError(
            f"resident({name!r}, build) takes a function that builds the object, got "
            f"{type(build).__name__}: write resident({name!r}, lambda: ...)"
        )
    if name not in _kept:
        _kept[name] = build()
        if _namespace is not None:
            _namespace[name] = _kept[name]
    return _kept[name]  # type: ignore[no-any-return]


def drop_resident(name: str) -> bool:
    """Forget the object kept under ``name`` (its memory is freed once nothing else holds
    it); True if there was one."""
    found = _kept.pop(name, None) is not None
    if found and _namespace is not None:
        _namespace.pop(name, None)
    return found


def resident_names() -> list[str]:
    """The names of the objects this worker keeps, in the order they were built."""
    return list(_kept)
