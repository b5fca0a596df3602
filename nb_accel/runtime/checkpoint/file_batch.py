"""Several files written aside, then put in place together, so that a save which fails part way
leaves the files of the previous save as they were.

Each file is written under a hidden temporary name in its own folder and flushed to disk; only
when every file is written are they renamed onto their final names, in the order they were
written. A failure while writing removes the temporary files and renames nothing.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

__all__ = ["FileBatch"]


class FileBatch:
    """Files to put in place together: use as a context manager; :meth:`write` each file, and
    they are renamed into place when the block ends without an exception, or removed when it
    raises.

    Example::

        with FileBatch() as batch:
            batch.write(folder / "a.bin", lambda name: torch.save(a, name))
            batch.write(folder / "index.json", lambda name: Path(name).write_text(text))
    """

    def __init__(self) -> None:
        self._pending: list[tuple[Path, Path]] = []

    def write(self, path: Path, write: Callable[[str], object]) -> None:
        """Have ``write`` write ``path``'s content to the temporary file whose name it is given,
        and flush that file to disk. ``path`` itself is untouched until the batch ends."""
        temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        self._pending.append((temporary, path))
        write(str(temporary))
        with open(temporary, "rb") as handle:
            os.fsync(handle.fileno())

    def __enter__(self) -> FileBatch:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        pending, self._pending = self._pending, []
        try:
            while kind is None and pending:
                temporary, path = pending[0]
                os.replace(temporary, path)
                pending.pop(0)
        finally:
            for temporary, _ in pending:
                temporary.unlink(missing_ok=True)
