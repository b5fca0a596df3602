"""Several files of one folder replaced as one, so that a crash at any point leaves the folder's
previous files or the new ones, never a mix of the two.

The folder may hold other files (a model's configuration, a tokenizer), so it cannot be swapped
whole; the files keep their names (the ones other tools read). So:

1. each file is written into a hidden folder beside them, ``.nb_accel-files-<random>``, and
   flushed to disk, then the hidden folder itself;
2. the list of what to put in place and what to remove, ``nb_accel-placement.json``, is
   written into it under a temporary name and renamed: **that rename is the commit**, one
   step;
3. each file is renamed onto its name, the files the save replaces are removed, then the list
   and the hidden folder, and the folder is flushed.

A crash before the commit leaves the previous files as they were (the next save into the folder
removes the hidden folder). A crash after it leaves a committed hidden folder:
:func:`finish_placement` completes its step 3, and every reader in nb_accel
(``load_checkpoint_in_model``) and the next save call it first, so they read the new files.
Finishing is idempotent, so processes reading the folder at the same time can all do it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType

from .durable import crash_point, fsync_path

__all__ = ["FileBatch", "finish_placement"]

_PREFIX = ".nb_accel-files-"
_PLACEMENT = "nb_accel-placement.json"


def _batches(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.name.startswith(_PREFIX) and p.is_dir())


def _place(directory: Path, batch: Path, placement: dict[str, list[str]]) -> None:
    """Step 3 for the committed ``batch`` (skipping what another process already did)."""
    for index, name in enumerate(placement["files"]):
        with contextlib.suppress(FileNotFoundError):
            os.replace(batch / name, directory / name)
        if index == 0:
            crash_point("files-placing")
    crash_point("files-placed")
    for name in placement["remove"]:
        with contextlib.suppress(FileNotFoundError):
            (directory / name).unlink()
    fsync_path(directory)
    crash_point("files-removed")
    shutil.rmtree(batch, ignore_errors=True)
    fsync_path(directory)


def _placement(batch: Path) -> dict[str, list[str]] | None:
    """The committed list of ``batch``; None before its commit (or once it is finished)."""
    try:
        placement = json.loads((batch / _PLACEMENT).read_text(encoding="utf-8"))
        return {"files": list(placement["files"]), "remove": list(placement["remove"])}
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise OSError(
            f"{batch / _PLACEMENT} is damaged ({error!r}): the save that wrote it was "
            f"interrupted and cannot be finished; remove {batch} and save again"
        ) from error


def finish_placement(directory: str | os.PathLike[str]) -> None:
    """Complete the placement of files that a save committed in ``directory`` and a crash
    interrupted (nothing when there is none), so that the folder holds the new files."""
    folder = Path(directory)
    for batch in _batches(folder):
        placement = _placement(batch)
        if placement is not None:
            try:
                _place(folder, batch, placement)
            except OSError as error:
                raise OSError(
                    f"cannot finish putting in place the files of an interrupted save in "
                    f"{folder} ({error}): make the folder writable and read it again, or save "
                    "again"
                ) from error


class FileBatch:
    """Files of ``directory`` to replace together: use as a context manager; :meth:`write`
    each file (and :meth:`remove` the names the save makes obsolete); they are committed and
    put in place when the block ends without an exception, or discarded when it raises.

    Example::

        with FileBatch(folder) as batch:
            batch.write("a.bin", lambda name: torch.save(a, name))
            batch.write("index.json", lambda name: Path(name).write_text(text))
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._files: list[str] = []
        self._remove: list[str] = []
        self._batch: Path | None = None

    def _folder(self) -> Path:
        if self._batch is None:
            if not self.directory.is_dir():
                self.directory.mkdir(parents=True, exist_ok=True)
                fsync_path(self.directory.parent)
            finish_placement(self.directory)
            for leftover in _batches(self.directory):  # uncommitted: an interrupted save's
                shutil.rmtree(leftover, ignore_errors=True)
            self._batch = self.directory / f"{_PREFIX}{secrets.token_hex(6)}"
            self._batch.mkdir()
        return self._batch

    def write(self, name: str, write: Callable[[str], object]) -> None:
        """Have ``write`` write the content of the file ``name`` (of the batch's folder) to the
        path it is given, and flush it to disk. The file named ``name`` is untouched until the
        batch is committed; files are put in place in the order they were written."""
        path = self._folder() / name
        write(str(path))
        fsync_path(path)
        self._files.append(name)

    def remove(self, names: Iterable[str]) -> None:
        """Remove these files of the folder when the batch is put in place (in this order)."""
        self._remove.extend(n for n in names if n not in self._files and n not in self._remove)

    def __enter__(self) -> FileBatch:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        batch, self._batch = self._batch, None
        if batch is None:
            return
        if kind is not None:
            shutil.rmtree(batch, ignore_errors=True)
            return
        placement = {"files": self._files, "remove": self._remove}
        pending = batch / f".{_PLACEMENT}.tmp"
        pending.write_text(json.dumps(placement), encoding="utf-8")
        fsync_path(pending)
        fsync_path(batch)
        crash_point("files-written")
        os.replace(pending, batch / _PLACEMENT)  # the commit
        fsync_path(batch)
        crash_point("files-committed")
        _place(self.directory, batch, placement)
