"""A dispatcher's global batch: joined from whole batches, completed, and cut into pieces."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from ..tree import concatenate, honor_type, rebuild_mapping, recursively_apply

__all__ = [
    "JoinedBatchSampler",
    "append_rows",
    "cut_leaf",
    "detached",
    "head_rows",
    "joined",
    "split_bounds",
]


def detached(leaf: Any) -> Any:
    """A tensor leaf copied out of the batch it views; other leaves as they are."""
    return leaf.clone() if isinstance(leaf, torch.Tensor) else leaf


def split_bounds(rows: int, parts: int, pad: bool) -> list[tuple[int, int]]:
    """Each process's ``[start, stop)`` rows; with ``pad`` all equal (``rows`` rounded up)."""
    if rows % parts == 0 or pad:
        per = -(-rows // parts)
        return [(r * per, (r + 1) * per) for r in range(parts)]
    base, extra = divmod(rows, parts)
    starts = [r * base + min(r, extra) for r in range(parts + 1)]
    return list(itertools.pairwise(starts))


def append_rows(batch: Any, first: Any, count: int) -> Any:
    """``batch`` with ``count`` more rows taken cyclically from ``first`` (same structure).

    Only tensors grow: other leaves, and lists that differ in length from ``first``'s (one
    item per sample, such as a list of strings: not sliced, so not completed), stay as they are.
    """
    if isinstance(batch, (list, tuple)) and len(batch) != len(first):
        return batch
    if isinstance(batch, (list, tuple)):
        items = zip(batch, first, strict=True)
        return honor_type(batch, (append_rows(b, f, count) for b, f in items))
    if isinstance(batch, Mapping):
        grown = {key: append_rows(value, first[key], count) for key, value in batch.items()}
        return rebuild_mapping(batch, grown)
    if isinstance(batch, torch.Tensor) and batch.dim() > 0:
        rows = torch.arange(count, device=first.device) % first.shape[0]
        return torch.cat([batch, first[rows].to(batch.device)])
    return batch


def joined(items: Iterator[Any], parts: int, drop_last: bool) -> Iterator[Any]:
    """Every ``parts`` consecutive items (each a whole batch) concatenated into a global batch;
    a shorter last group too, unless ``drop_last``."""
    while group := list(itertools.islice(items, parts)):
        if len(group) == parts or not drop_last:
            yield concatenate(group)


def cut_leaf(leaf: Any, start: int, stop: int) -> Any:
    """Rows ``[start, stop)`` of a tensor leaf; other leaves (and 0-d tensors) whole."""
    return leaf[start:stop] if isinstance(leaf, torch.Tensor) and leaf.dim() > 0 else leaf


def head_rows(batch: Any, count: int) -> Any:
    """Copies of the first ``count`` rows of every tensor (kept to complete the last batch)."""
    return recursively_apply(lambda t: t[:count].clone() if t.dim() > 0 else t, batch)


class JoinedBatchSampler:
    """Index lists of ``parts`` consecutive batches of ``base`` joined into one (a dispatcher's
    step); with ``drop_last`` a step of fewer than ``parts`` batches is dropped."""

    def __init__(self, base: Any, parts: int, drop_last: bool) -> None:
        self.base = base
        self.parts = parts
        self.drop_last = drop_last

    def __iter__(self) -> Iterator[list[Any]]:
        iterator = iter(self.base)
        while True:
            group = list(itertools.islice(iterator, self.parts))
            if not group or (len(group) < self.parts and self.drop_last):
                return
            yield [index for batch in group for index in batch]

    def __len__(self) -> int:
        batches = len(self.base)
        return batches // self.parts if self.drop_last else math.ceil(batches / self.parts)
