"""Letting forked workers start their own OpenMP threads.

GNU OpenMP (``libgomp``, which PyTorch's CPU builds use for intra-op parallelism) keeps a pool
of threads for the thread that first ran a parallel region. ``fork`` copies that bookkeeping
into the child but not the threads, so the child's first parallel region with more than one
thread waits forever for threads that do not exist: a kernel that ran a large matrix product,
then forked a worker that trains with several threads, hangs in the worker.

Before forking, :func:`release_openmp_threads` asks every loaded ``libgomp`` to free the
calling thread's pool (OpenMP 5's ``omp_pause_resource_all``); the child then builds a fresh
pool, and the kernel's next parallel region does too (a few threads started, once).
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable

__all__ = ["release_openmp_threads", "loaded_openmp_libraries"]

#: ``omp_pause_hard``: free the threads and everything else OpenMP holds.
_PAUSE_HARD = 2

#: Each runtime's ``omp_pause_resource_all`` (``None``: it has none), by path: loaded once, as a
#: ``ctypes.CDLL`` made per launch would be left in a reference cycle (its function pointer
#: class refers back to it) for the garbage collector.
_pause_functions: dict[str, Callable[[int], int] | None] = {}


def _pause_function(path: str) -> Callable[[int], int] | None:
    """``omp_pause_resource_all`` of the runtime at ``path`` (``None``: it has none)."""
    if path not in _pause_functions:
        try:
            pause = ctypes.CDLL(path).omp_pause_resource_all
        except (OSError, AttributeError):
            _pause_functions[path] = None
        else:
            pause.restype = ctypes.c_int
            pause.argtypes = [ctypes.c_int]
            _pause_functions[path] = pause
    return _pause_functions[path]


def loaded_openmp_libraries() -> list[str]:
    """Paths of the GNU OpenMP runtimes mapped into this process (Linux; else empty)."""
    if not sys.platform.startswith("linux"):
        return []
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libgomp" in line and "/" in line}
    except OSError:
        return []
    return sorted(paths)


def release_openmp_threads() -> int:
    """Free the calling thread's OpenMP thread pool in every loaded ``libgomp``; returns how
    many runtimes did so. Call it from the thread that is about to fork, outside any parallel
    region. Harmless where there is nothing to free or no such runtime."""
    released = 0
    for path in loaded_openmp_libraries():
        pause = _pause_function(path)
        if pause is not None and pause(_PAUSE_HARD) == 0:
            released += 1
    return released
