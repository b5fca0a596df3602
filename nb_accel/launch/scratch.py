"""Private scratch folders of launches and pools: the rendezvous file store and the
shared-memory segments of big payloads and results live there, so the folders are made in
``/dev/shm`` where the machine has one (memory, never the disk).

A folder is named after the kernel's pid (``nb_accel-<kind>-<pid>-<random>``) and removed when
its launch or pool ends. A kernel that is killed cannot remove its own, so each new folder's
creation also removes those left by kernels that no longer exist.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from ..worker.transfer.segments import SHM_ROOT, shared_root

__all__ = ["make_scratch_dir", "remove_orphaned_scratch_dirs"]

_NAME = re.compile(r"^nb_accel-[a-z]+-(\d+)-")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sweep(root: Path) -> None:
    """Remove this user's scratch folders whose kernel has gone."""
    try:
        entries = list(root.iterdir())
    except OSError:
        return
    for entry in entries:
        match = _NAME.match(entry.name)
        if not match or _alive(int(match.group(1))):
            continue
        try:
            if entry.is_dir() and entry.stat().st_uid == os.getuid():
                shutil.rmtree(entry, ignore_errors=True)
        except OSError:
            continue


def _roots() -> list[Path]:
    """Where scratch folders may be: ``/dev/shm``, and the temporary folder (which holds them
    while ``/dev/shm`` is full)."""
    return [Path(root) for root in dict.fromkeys((SHM_ROOT, tempfile.gettempdir()))]


def remove_orphaned_scratch_dirs() -> None:
    """Remove this user's scratch folders whose process has gone (killed before it could
    remove its own); each new folder's creation does the same."""
    for root in _roots():
        _sweep(root)


def make_scratch_dir(kind: str) -> str:
    """A new private folder for a ``kind`` (``"launch"``, ``"pool"``) of this kernel, in
    ``/dev/shm`` while it has room (see :func:`~nb_accel.worker.transfer.segments.shared_root`)."""
    remove_orphaned_scratch_dirs()
    return tempfile.mkdtemp(prefix=f"nb_accel-{kind}-{os.getpid()}-", dir=shared_root())
