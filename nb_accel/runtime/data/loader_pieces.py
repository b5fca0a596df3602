"""Process 0 of a dispatcher: load a step as every process's piece, not as one global batch.

For a map-style dataset collated by torch's ``default_collate`` (no loader workers, no pinned
memory), collating a step's samples and cutting the result gives exactly the pieces that
collating each process's share of the samples gives. So process 0 collates its own share as a
shard loader would, and stacks every other process's share straight into that process's part
of the message (:class:`Stacked`): the global batch is never built, and the step's data is
written once instead of three times (collated, cut out, copied into the message).

A step whose pieces are not all tensors of the piece's length (strings, for instance, which
the dispatcher hands to every process whole), samples whose structure this module does not
follow, and a last step that does not fill every piece, are collated whole and cut the ordinary
way; after one such step the rest of the iteration goes that way too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast

import torch
from torch.utils.data import DataLoader, IterableDataset, default_collate

from ..tree import flatten_tree, unflatten_tree
from .wire import Laid, Prepared, Preparer, layout_leaves

__all__ = ["Stacked", "pieces_supported", "prepared_steps", "sample_columns"]

#: ``fn(preparer, global_batch, first) -> Prepared``: the ordinary way (collate, then cut).
CutFn = Callable[[Preparer, Any, Any], Prepared]
_NUMBERS = (int, float, bool)


def pieces_supported(loader: DataLoader) -> bool:  # type: ignore[type-arg]
    """True when ``loader``'s steps can be collated piece by piece (see the module's notes)."""
    return (
        loader.num_workers == 0
        and not loader.pin_memory
        and not isinstance(loader.dataset, IterableDataset)  # a map-style dataset
        and loader.batch_sampler is not None  # samples collated into batches
        and loader.collate_fn is default_collate
    )


def _is_leaf(value: Any) -> bool:
    if isinstance(value, (torch.Tensor, *_NUMBERS)):
        return True
    kind = type(value)
    return kind.__module__ == "numpy" and getattr(value, "dtype", None) is not None


def sample_columns(samples: Sequence[Any]) -> tuple[list[Sequence[Any]], tuple[Any, ...]] | None:
    """The samples' leaves as columns, in the order of ``default_collate``'s output leaves.

    Returns ``(columns, shape)`` where ``shape`` records every container's type and keys or
    length (pieces line up only when theirs are equal), or None when the samples hold anything but
    tensors, numbers and numpy arrays in lists, tuples and mappings, or sequences of unequal
    length (which ``default_collate`` refuses: the ordinary way reports it).
    """
    columns: list[Sequence[Any]] = []
    shape: list[Any] = []

    def visit(batch: Sequence[Any]) -> bool:
        first = batch[0]
        if _is_leaf(first):
            columns.append(batch)
            return True
        if isinstance(first, Mapping):
            keys = tuple(first)
            shape.append((type(first), keys))
            return all(visit([sample[key] for sample in batch]) for key in keys)
        if isinstance(first, (list, tuple)):
            if len(set(map(len, batch))) != 1:
                return False
            shape.append((type(first), len(first)))
            return all(visit(column) for column in zip(*batch, strict=True))
        return False

    try:
        return (columns, tuple(shape)) if visit(samples) else None
    except (KeyError, TypeError):
        return None


class Stacked:
    """One tensor of a piece, collated from its column of samples straight into a message."""

    def __init__(self, column: Sequence[Any]) -> None:
        self.column = column

    def write_into(self, out: torch.Tensor) -> None:
        """Collate the column into ``out`` as ``default_collate`` would collate it (which, too,
        goes by the first sample's type)."""
        column = self.column
        if out.device.type == "cpu" and isinstance(column[0], torch.Tensor):
            torch.stack(cast("list[torch.Tensor]", column), 0, out=out)
        else:
            out.copy_(default_collate(cast("list[Any]", column)))


def _collate_column(column: Sequence[Any]) -> torch.Tensor:
    """One leaf of a collated piece: what ``default_collate`` makes of the column."""
    if isinstance(column[0], torch.Tensor):
        return torch.stack(cast("list[torch.Tensor]", column), 0)
    return cast(torch.Tensor, default_collate(cast("list[Any]", column)))


class _LastLayout:
    """What the previous steps settled: the collated structure of each kind of sample, and the
    previous step's layout, reused while the pieces keep their shapes (the common case), which
    also makes the layouts compare equal at once when the step is sent."""

    def __init__(self) -> None:
        self.key: Any = None
        self.laid: Laid | None = None
        self.collated: dict[Any, Any] = {}

    def get(self, treedef: Any, leaves: list[torch.Tensor]) -> Laid:
        key = (treedef, [(leaf.shape, leaf.dtype) for leaf in leaves])
        if self.laid is None or key != self.key:
            self.key, self.laid = key, layout_leaves(treedef, leaves)
        return (self.laid[0], list(leaves), self.laid[2])


def _own_piece(samples: list[Any], last: _LastLayout) -> tuple[Any, Any, tuple[Any, ...]] | None:
    """Process 0's piece collated as ``default_collate`` collates it, its structure and its
    samples' shape (see :func:`sample_columns`); None when it is not all tensors of its length.

    The first piece of a kind of sample goes through ``default_collate`` itself, which gives the
    piece's structure; later ones are collated column by column into that structure.
    """
    found = sample_columns(samples)
    if found is None:
        return None
    columns, shape = found
    treedef = last.collated.get(shape)
    if treedef is not None:
        return unflatten_tree(treedef, map(_collate_column, columns)), treedef, shape
    own = default_collate(samples)
    leaves, treedef = flatten_tree(own)
    rows = len(samples)
    if len(leaves) != len(columns) or not all(
        isinstance(leaf, torch.Tensor) and leaf.dim() > 0 and len(leaf) == rows for leaf in leaves
    ):
        return None
    last.collated[shape] = treedef
    return own, treedef, shape


def _direct(
    samples: list[Any], bounds: list[tuple[int, int]], last: _LastLayout
) -> tuple[Any, list[Laid]] | None:
    """Process 0's collated piece and every piece laid out, or None (see the module's notes)."""
    own_rows = bounds[0][1] - bounds[0][0]
    found = _own_piece(samples[: bounds[0][1]], last)
    if found is None:
        return None
    own, treedef, shape = found
    leaves, _ = flatten_tree(own)
    base = last.get(treedef, leaves)
    laid = [base]
    for start, stop in bounds[1:]:
        piece = sample_columns(samples[start:stop])
        if piece is None or piece[1] != shape or stop - start != own_rows:
            return None
        laid.append((base[0], [Stacked(column) for column in piece[0]], base[2]))
    return own, laid


def prepared_steps(
    loader: DataLoader,  # type: ignore[type-arg]
    preparer: Preparer,
    bounds: list[tuple[int, int]],
    skip: int,
    head_rows: Callable[[Any], Any] | None,
    cut: CutFn,
) -> Iterator[Prepared]:
    """Every step of one iteration of ``loader`` (whose index sampler yields whole steps).

    ``bounds`` are the pieces' rows in a full step; ``skip`` steps are passed over without
    loading; ``head_rows`` (when the last step is to be completed) keeps the rows the last
    step borrows from the first; ``cut`` prepares a step the ordinary way.
    """
    # The loader's own iterator, so the loader draws its base seed exactly as when iterated.
    iterator = DataLoader.__iter__(loader)
    dataset = loader.dataset
    getitems = getattr(dataset, "__getitems__", None)
    full = bounds[-1][1]
    direct, last = True, _LastLayout()
    first: Any = None
    index = 0
    while True:
        try:
            indices = iterator._next_index()  # type: ignore[attr-defined]
        except StopIteration:
            return
        index += 1
        if index <= skip:
            continue
        samples = getitems(indices) if getitems else [dataset[i] for i in indices]
        if first is None and head_rows is not None:
            first = head_rows(default_collate(samples[: len(bounds)]))
        found = _direct(samples, bounds, last) if direct and len(samples) == full else None
        direct = direct and (found is not None or len(samples) != full)
        if found is not None:
            yield preparer.prepare(full, found[0], found[1])
        else:
            yield cut(preparer, default_collate(samples), first)
