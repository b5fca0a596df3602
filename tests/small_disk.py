"""A small file system of a test's own (a tmpfs mounted on a folder under ``tmp_path``), for
writes that must meet a full disk; unmounted on exit. Mounting needs root: elsewhere the test
skips (never in CI, where it fails instead)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from system_features import unavailable

__all__ = ["fill", "small_disk"]


@contextmanager
def small_disk(path: Path, size_bytes: int) -> Iterator[Path]:
    """``path`` (made if missing) on a tmpfs of ``size_bytes`` while the block runs."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        unavailable("mounting a small file system for a full disk needs root and mount(8)")
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "small-disk", str(path)], check=True
    )
    try:
        yield path
    finally:
        subprocess.run(["umount", "--lazy", str(path)], check=True)


def fill(path: Path) -> None:
    """Fill the file system of ``path`` (a file there) to the brim."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        while True:
            os.write(fd, bytes(1 << 16))
    except OSError:
        pass
    finally:
        os.close(fd)
