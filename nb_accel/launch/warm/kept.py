"""The kernel's warm workers: one pool at a time, kept between launches and cells, shared by
``notebook_launcher(..., reuse_workers=True)`` and ``%%distributed``, stopped by
:func:`stop_workers` (and when the interpreter exits)."""

from __future__ import annotations

import atexit

from ..pool import WorkerPool

__all__ = ["keep_pool", "kept_pool", "stop_workers"]

_pool: WorkerPool | None = None


def kept_pool() -> WorkerPool | None:
    """The kernel's warm workers (``None``: none started, or stopped)."""
    return _pool


def keep_pool(pool: WorkerPool | None) -> None:
    """Keep ``pool`` as the kernel's warm workers (stopping none: see :func:`stop_workers`)."""
    global _pool  # noqa: PLW0603 - one pool per kernel
    _pool = pool


def stop_workers() -> None:
    """Stop the kernel's warm workers, if any: the ``%%distributed`` pool and the workers kept
    by ``notebook_launcher(..., reuse_workers=True)``, which are the same. The next warm launch
    or cell starts fresh ones."""
    global _pool
    pool, _pool = _pool, None
    if pool is not None:
        pool.stop()


atexit.register(stop_workers)
