"""Checkpoint folders: automatic names, appearing whole or not at all, pruning the oldest.

Automatic names count up: a new checkpoint is numbered past the highest ``checkpoint_<n>``
already in the folder (a rerun in the same project folder continues the numbering), so the
newest checkpoint is always the one written last, and pruning removes only older ones.

A checkpoint is written into a hidden staging folder next to its final place
(``.checkpoint_3.partial-<random>``) and renamed into place once every process has written its
files, so a reader never sees a half-written checkpoint: a process killed in the middle leaves
only a staging folder, which the next save removes. Replacing an existing folder swaps the two
atomically where Linux allows it (``renameat2(RENAME_EXCHANGE)``).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import re
import secrets
import shutil
from pathlib import Path

__all__ = [
    "CHECKPOINTS",
    "checkpoint_number",
    "commit",
    "fsync_path",
    "make_staging",
    "next_checkpoint_number",
    "numbered_checkpoints",
    "prune",
]

#: Subfolder of the project folder that holds the automatically named checkpoints.
CHECKPOINTS = "checkpoints"
_NUMBERED = re.compile(r"^checkpoint_(\d+)$")
_STAGING = re.compile(r"^\.(.+)\.partial-[0-9a-f]+$")
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def checkpoint_number(folder: str | os.PathLike[str]) -> int | None:
    """``n`` for a folder named ``checkpoint_<n>``, else None."""
    match = _NUMBERED.match(Path(folder).name)
    return int(match.group(1)) if match else None


def numbered_checkpoints(parent: str | os.PathLike[str]) -> list[Path]:
    """The ``checkpoint_<n>`` folders in ``parent``, oldest (smallest ``n``) first."""
    root = Path(parent)
    if not root.is_dir():
        return []
    found = [
        entry for entry in root.iterdir() if entry.is_dir() and checkpoint_number(entry) is not None
    ]
    return sorted(found, key=lambda entry: checkpoint_number(entry) or 0)


def next_checkpoint_number(parent: str | os.PathLike[str], at_least: int = 0) -> int:
    """The number the next automatically named checkpoint in ``parent`` gets: one past the
    highest ``checkpoint_<n>`` already there, and never less than ``at_least``."""
    found = numbered_checkpoints(parent)
    highest = checkpoint_number(found[-1]) if found else None
    return at_least if highest is None else max(at_least, highest + 1)


def fsync_path(path: str | os.PathLike[str]) -> None:
    """Flush a file's or a folder's entries to disk (best effort where a file system cannot)."""
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


def make_staging(final: str | os.PathLike[str]) -> Path:
    """Create an empty staging folder for ``final`` in its parent (created if missing), after
    removing staging folders that earlier, interrupted saves of ``final`` left there."""
    target = Path(final)
    target.parent.mkdir(parents=True, exist_ok=True)
    for entry in target.parent.iterdir():
        match = _STAGING.match(entry.name)
        if match and match.group(1) == target.name and entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
    staging = target.parent / f".{target.name}.partial-{secrets.token_hex(6)}"
    staging.mkdir()
    return staging


def _exchange(first: Path, second: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2``); False where that is not available."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    result = renameat2(
        _AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE
    )
    return bool(result == 0)


def commit(staging: str | os.PathLike[str], final: str | os.PathLike[str]) -> None:
    """Move the finished ``staging`` folder to ``final``; an existing ``final`` is replaced
    (atomically where the system can swap folders) and then removed."""
    source, target = Path(staging), Path(final)
    for entry in source.iterdir():
        fsync_path(entry)
    fsync_path(source)
    if not target.exists():
        os.rename(source, target)
    elif _exchange(source, target):
        shutil.rmtree(source)  # now holds the replaced checkpoint
    else:
        retired = target.parent / f".{target.name}.replaced-{secrets.token_hex(6)}"
        os.rename(target, retired)
        os.rename(source, target)
        shutil.rmtree(retired, ignore_errors=True)
    fsync_path(target.parent)


def prune(parent: str | os.PathLike[str], keep: int, newest: int) -> list[Path]:
    """Make room for ``checkpoint_<newest>``, just written: of the checkpoints of ``parent``
    numbered below it, keep the newest ``keep - 1`` and remove the others. The new checkpoint,
    and any numbered above it, are never removed. Returns the folders removed."""
    older = [
        folder
        for folder in numbered_checkpoints(parent)
        if (checkpoint_number(folder) or 0) < newest
    ]
    doomed = older[: max(0, len(older) - max(keep - 1, 0))]
    for folder in doomed:
        shutil.rmtree(folder)
    if doomed:
        fsync_path(parent)
    return doomed
