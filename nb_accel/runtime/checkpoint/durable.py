"""Writing that survives a crash: files and folders flushed to disk, and the named points of the
commit sequences (:mod:`.folders`, :mod:`.file_batch`) where a test can have the process killed.

A rename is atomic on POSIX file systems, NFS included, but only durable once the folder holding
the name is flushed too; so a commit flushes the files first, then their folder, renames, then
flushes the parent folder. Flushing is best effort where a file system cannot (``EINVAL`` on
some network file systems, which write through on close anyway).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
from pathlib import Path

__all__ = [
    "CRASH_AT",
    "FULL_BELOW_BYTES",
    "crash_point",
    "fsync_path",
    "space_explained",
    "sync_tree",
]

#: A write that failed where its file system has less than this free is taken for a full disk,
#: whatever the writer said (torch's own writer says ``unexpected pos`` or ``iostream error``).
FULL_BELOW_BYTES = 1 << 20

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


def _free_bytes(folder: Path) -> int | None:
    try:
        stats = os.statvfs(folder)
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize


def space_explained(problem: Exception, folder: Path, what: str, process: int) -> Exception:
    """``problem`` (writing ``what`` into ``folder`` failed on ``process``) said plainly when
    the disk is full: an ``OSError`` (``ENOSPC``) naming the folder, the free space and what to
    do, chained to ``problem``; otherwise ``problem`` itself."""
    full = isinstance(problem, OSError) and problem.errno in (errno.ENOSPC, errno.EDQUOT)
    free = _free_bytes(folder if folder.exists() else folder.parent)
    if not full and (free is None or free >= FULL_BELOW_BYTES):
        return problem
    left = "" if free is None else f" ({free:,} bytes free)"
    message = (
        f"No space left on device: writing {what} failed on process {process}: the file system "
        f"of {folder.parent}{left} is full ({type(problem).__name__}: {problem}). Free space "
        "there, or save elsewhere (ProjectConfiguration(project_dir=...), or "
        "save_state(output_dir)); the previous checkpoint is untouched"
    )
    explained = OSError(errno.ENOSPC, message)
    explained.__cause__ = problem
    return explained
