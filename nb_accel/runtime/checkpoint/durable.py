"""Writing that survives a crash: files and folders flushed to disk, and the named points of the
commit sequences (:mod:`.folders`, :mod:`.file_batch`) where a test can have the process killed.

A rename is atomic on POSIX file systems, NFS included, but only durable once the folder holding
the name is flushed too; so a commit flushes the files first, then their folder, renames, then
flushes the parent folder. Flushing is best effort where a file system cannot (``EINVAL`` on
some network file systems, which write through on close anyway).
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

__all__ = ["CRASH_AT", "crash_point", "fsync_path", "sync_tree"]

#: Test-only: the environment variable naming the commit step at which :func:`crash_point`
#: kills the process (``SIGKILL``), so that a test can check what a crash there leaves. Never
#: set it outside tests.
CRASH_AT = "NB_ACCEL_TEST_CRASH_AT"


def crash_point(step: str) -> None:
    """Test-only hook: a commit sequence has reached ``step``; when ``$NB_ACCEL_TEST_CRASH_AT``
    names it, the process kills itself there with ``SIGKILL``, as a power cut or the kernel's
    out-of-memory killer would. Otherwise (always, outside tests) it does nothing."""
    if os.environ.get(CRASH_AT) == step:
        os.kill(os.getpid(), signal.SIGKILL)


def fsync_path(path: str | os.PathLike[str]) -> None:
    """Flush a file's or a folder's entries to disk (best effort where a file system cannot);
    a path that is gone (another process moved it) is skipped."""
    flags = os.O_RDONLY | (os.O_DIRECTORY if Path(path).is_dir() else 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def sync_tree(root: str | os.PathLike[str]) -> None:
    """Flush every file under ``root``, then every folder from the deepest up, ``root`` last.

    Each process of a checkpoint calls it on the folder they all write into, after writing its
    own part: the writer of every file flushes it (which a network file system needs), and a
    file another process is still writing is flushed again by its writer."""
    folders: list[str] = []
    for current, _, files in os.walk(root):
        folders.append(current)
        for name in files:
            fsync_path(os.path.join(current, name))
    for folder in reversed(folders):
        fsync_path(folder)
