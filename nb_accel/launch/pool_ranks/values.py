"""What a pool's ranks send back for a command: a value to load in the kernel, or to discard."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..._messages import CellDone
from ...worker.transfer.pickling import loads, segments_of
from ...worker.transfer.segments import remove_segment

__all__ = ["discard_values", "load_value"]


def discard_values(replies: Iterable[CellDone]) -> None:
    """Remove the shared-memory segments of values that will not be loaded."""
    for reply in replies:
        for segment in segments_of(reply.value) if reply.value is not None else ():
            remove_segment(segment)


def load_value(done: CellDone) -> Any:
    """The value a rank sent back (its ``repr`` when it could not be pickled)."""
    if done.value is not None:
        return loads(done.value, consume=True)
    return done.value_repr
