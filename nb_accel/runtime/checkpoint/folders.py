"""Checkpoint folders: automatic names, appearing whole or not at all, pruning the oldest.

Automatic names count up: a new checkpoint is numbered past the highest ``checkpoint_<n>``
already in the folder (a rerun in the same project folder continues the numbering), so the
newest checkpoint is always the one written last, and pruning removes only older ones.

A checkpoint is written into a hidden staging folder next to its final place
(``.checkpoint_3.partial-<random>``), flushed to disk by every process that wrote into it, given
its description file last, and then renamed into place in one step (:func:`commit`): a reader
sees the previous checkpoint or the new one, never a mix, and a process killed before the
rename leaves only a staging folder, which the next save removes. Replacing an existing folder
swaps the two atomically where Linux allows it (``renameat2(RENAME_EXCHANGE)``); elsewhere (NFS)
the old folder is first renamed aside (``.checkpoint_3.replaced-<random>``), and until the new
one is in place that copy is the checkpoint: :func:`set_aside_copy` finds it for a load, and
the next save puts it back before it starts. Pruning renames a folder aside
(``.checkpoint_1.pruned-<random>``) before removing it, so a checkpoint never stays half
removed under its name.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import secrets
import shutil
from pathlib import Path

from .durable import crash_point, fsync_path

__all__ = [
    "CHECKPOINTS",
    "checkpoint_number",
    "commit",
    "make_staging",
    "next_checkpoint_number",
    "numbered_checkpoints",
    "prune",
    "set_aside_copy",
]

#: Subfolder of the project folder that holds the automatically named checkpoints.
CHECKPOINTS = "checkpoints"
_NUMBERED = re.compile(r"^checkpoint_(\d+)$")
#: The hidden folders of the commit sequence: a staging folder (``partial``), the previous
#: checkpoint renamed aside while it is replaced (``replaced``), one being pruned (``pruned``).
_ASIDE = re.compile(r"^\.(.+)\.(partial|replaced|pruned)-[0-9a-f]+$")
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


def _aside(parent: Path) -> list[tuple[Path, str, str]]:
    """The hidden folders of commit sequences in ``parent``: (folder, the checkpoint's name,
    ``partial`` | ``replaced`` | ``pruned``)."""
    found = []
    for entry in parent.iterdir() if parent.is_dir() else []:
        match = _ASIDE.match(entry.name)
        if match and entry.is_dir():
            found.append((entry, match.group(1), match.group(2)))
    return sorted(found)


def set_aside_copy(final: str | os.PathLike[str]) -> Path | None:
    """The previous checkpoint of ``final``, renamed aside whole by a replacement that a crash
    interrupted before the new folder was renamed in: while ``final`` is missing, that copy is
    the checkpoint (it is removed only once the new one is in place). None when there is
    none."""
    target = Path(final)
    if target.exists():
        return None
    for entry, name, kind in _aside(target.parent):
        if name == target.name and kind == "replaced":
            return entry
    return None


def _tidy(target: Path) -> None:
    """Before a save of ``target``: put back a previous checkpoint that an interrupted
    replacement left aside (while ``target`` is missing), then remove what interrupted saves of
    ``target`` and interrupted prunings in its folder left behind."""
    kept = set_aside_copy(target)
    if kept is not None:
        os.rename(kept, target)
        fsync_path(target.parent)
    for entry, name, kind in _aside(target.parent):
        if kind == "pruned" or name == target.name:
            shutil.rmtree(entry, ignore_errors=True)


def make_staging(final: str | os.PathLike[str]) -> Path:
    """Create an empty staging folder for ``final`` in its parent (created if missing), after
    tidying what earlier, interrupted saves left there: a previous checkpoint set aside by an
    interrupted replacement is put back, staging folders of ``final`` and folders left half
    pruned are removed."""
    target = Path(final)
    target.parent.mkdir(parents=True, exist_ok=True)
    _tidy(target)
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
    """Move the finished ``staging`` folder to ``final`` in one rename; an existing ``final``
    is replaced (swapped atomically where the system can, else renamed aside first) and then
    removed. ``staging``'s content must be on disk already (every writer flushed its part);
    its folder entry is flushed here, and the parent's after the rename."""
    source, target = Path(staging), Path(final)
    fsync_path(source)
    retired = None
    if not target.exists():
        os.rename(source, target)
    elif _exchange(source, target):
        retired = source  # now holds the replaced checkpoint
    else:
        retired = target.parent / f".{target.name}.replaced-{secrets.token_hex(6)}"
        os.rename(target, retired)
        fsync_path(target.parent)
        crash_point("state-set-aside")
        os.rename(source, target)
    crash_point("state-renamed")
    fsync_path(target.parent)
    crash_point("state-placed")
    if retired is not None:
        shutil.rmtree(retired, ignore_errors=True)


def prune(parent: str | os.PathLike[str], keep: int, newest: int) -> list[Path]:
    """Make room for ``checkpoint_<newest>``, just written: of the checkpoints of ``parent``
    numbered below it, keep the newest ``keep - 1`` and remove the others, each renamed aside
    first so that it disappears whole. The new checkpoint, and any numbered above it, are never
    removed. Returns the folders removed."""
    older = [
        folder
        for folder in numbered_checkpoints(parent)
        if (checkpoint_number(folder) or 0) < newest
    ]
    doomed = older[: max(0, len(older) - max(keep - 1, 0))]
    for folder in doomed:
        aside = folder.parent / f".{folder.name}.pruned-{secrets.token_hex(6)}"
        os.rename(folder, aside)
        fsync_path(folder.parent)
        crash_point("state-pruning")
        shutil.rmtree(aside)
    return doomed
