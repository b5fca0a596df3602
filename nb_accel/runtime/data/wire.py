"""The dispatcher's message format: a header, a layout when it changed, packed tensor data.

A *layout* is a tree with a :class:`Slot` (offset, shape, dtype) in place of every dense tensor;
other leaves stay in it as they are. Process 0 sends each step as one message per process: the
:class:`Header` (this step's global batch size, the next step's, ...), the pickled layouts when
they differ from the previous step's, and the process's tensors packed into bytes. How the bytes
travel is up to a link (:mod:`~nb_accel.runtime.data.link_local`,
:mod:`~nb_accel.runtime.data.link_gloo`).
"""

from __future__ import annotations

import pickle
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import torch

from ..tree import TreeDef, flatten_tree, unflatten_tree

__all__ = [
    "HEADER_BYTES",
    "Header",
    "Slot",
    "Opaque",
    "Deferred",
    "Prepared",
    "Preparer",
    "aligned",
    "Laid",
    "layout",
    "layout_leaves",
    "pack_into",
    "pack_targets",
    "write_packed",
    "spec_bytes",
    "unpack",
]

_ALIGN = 16
_HEADER = struct.Struct("<8q")
#: Bytes of a packed :class:`Header`.
HEADER_BYTES = _HEADER.size


class Header(NamedTuple):
    """What precedes a step's data. ``rows`` is -1 in the opening message of an iteration.

    ``next_size`` (bytes of the next message), ``slot``, ``region`` and ``ring_bytes`` are
    used by the links that need them and 0 otherwise.
    """

    epoch: int
    rows: int
    next_rows: int
    next_size: int
    layout_bytes: int
    slot: int = 0
    region: int = 0
    ring_bytes: int = 0

    def pack(self) -> bytes:
        """The header as bytes."""
        return _HEADER.pack(*self)

    @classmethod
    def unpack(cls, data: bytes) -> Header:
        """The header in ``data`` (exactly :data:`HEADER_BYTES` bytes)."""
        return cls(*_HEADER.unpack(data))


_PLAIN = (str, int, float, bool, bytes, type(None))


@dataclass(frozen=True)
class Slot:
    """Where one tensor lies in a message, counted from the start of its data section."""

    offset: int
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        """Size of the tensor's data in bytes."""
        count = 1
        for size in self.shape:
            count *= size
        return count * self.dtype.itemsize


class Opaque:
    """A leaf that travels inside the layout (pickled); equal only to itself, so a layout that
    holds one never matches the previous one."""

    def __init__(self, value: Any) -> None:
        self.value = value


def _packable(tensor: torch.Tensor) -> bool:
    return (
        tensor.layout == torch.strided
        and not tensor.is_quantized
        and not getattr(tensor, "is_nested", False)
        and not tensor.is_conj()
        and not tensor.is_neg()
    )


def aligned(size: int) -> int:
    """``size`` rounded up to a multiple of 16 bytes."""
    return -(-size // _ALIGN) * _ALIGN


class Deferred(Protocol):
    """A tensor of a piece that is not built yet: it is written straight into the message."""

    def write_into(self, out: torch.Tensor) -> None:
        """Write the tensor into ``out`` (its shape and dtype, possibly on another device)."""


#: One process's piece laid out: (layout, tensors to pack, bytes they take).
Laid = tuple[Any, list[torch.Tensor | Deferred], int]


def layout_leaves(treedef: TreeDef, leaves: list[Any]) -> Laid:
    """Lay out a flattened tree (see :func:`~nb_accel.runtime.tree.flatten_tree`)."""
    specs: list[Any] = []
    tensors: list[torch.Tensor | Deferred] = []
    cursor = 0
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor) and _packable(leaf):
            specs.append(Slot(cursor, tuple(leaf.shape), leaf.dtype))
            tensors.append(leaf)
            cursor += aligned(leaf.numel() * leaf.element_size())
        else:
            specs.append(leaf if isinstance(leaf, _PLAIN) else Opaque(leaf))
    return (treedef, tuple(specs)), tensors, cursor


def layout(tree: Any) -> Laid:
    """``(layout, tensors, nbytes)``: the tree's layout, its packed tensors in layout order, and
    the bytes they take (a multiple of 16)."""
    leaves, treedef = flatten_tree(tree)
    return layout_leaves(treedef, leaves)


def pack_targets(buffer: torch.Tensor, spec: Any, start: int) -> list[torch.Tensor]:
    """Where each packed tensor of layout ``spec`` goes in a 1-d uint8 ``buffer`` when its data
    section starts at byte ``start``: views of ``buffer`` of the tensors' shapes and dtypes."""
    targets = []
    for slot in spec[1]:
        if isinstance(slot, Slot):
            begin = start + slot.offset
            targets.append(buffer[begin : begin + slot.nbytes].view(slot.dtype).view(slot.shape))
    return targets


def write_packed(targets: list[torch.Tensor], tensors: list[torch.Tensor | Deferred]) -> None:
    """Copy ``tensors`` into their ``targets`` (from :func:`pack_targets`); a
    :class:`Deferred` one writes itself there."""
    for target, tensor in zip(targets, tensors, strict=True):
        if isinstance(tensor, torch.Tensor):
            target.copy_(tensor.detach())
        else:
            tensor.write_into(target)


def pack_into(
    buffer: torch.Tensor, spec: Any, tensors: list[torch.Tensor | Deferred], start: int
) -> None:
    """Copy ``tensors`` (from :func:`layout`) into a 1-d uint8 ``buffer`` from byte ``start``;
    a :class:`Deferred` one writes itself there."""
    write_packed(pack_targets(buffer, spec, start), tensors)


def spec_bytes(spec: Any) -> int:
    """Bytes the packed tensors of a layout take (where its last tensor ends)."""
    return max((leaf.offset + leaf.nbytes for leaf in spec[1] if isinstance(leaf, Slot)), default=0)


def unpack(spec: Any, buffer: torch.Tensor, start: int) -> Any:
    """Rebuild the tree of ``spec`` with tensors that are views into ``buffer`` (no copies)."""

    def rebuild(leaf: Any) -> Any:
        if isinstance(leaf, Opaque):
            return leaf.value
        if not isinstance(leaf, Slot):
            return leaf
        begin = start + leaf.offset
        return buffer[begin : begin + leaf.nbytes].view(leaf.dtype).view(leaf.shape)

    treedef, leaves = spec
    return unflatten_tree(treedef, (rebuild(leaf) for leaf in leaves))


@dataclass
class Prepared:
    """One step, ready to send: process 0's own piece, everyone's layout, the message size."""

    rows: int
    own: Any
    specs: list[Any]
    tensors: list[list[torch.Tensor | Deferred]]
    layout_bytes: bytes
    data_size: int

    @property
    def size(self) -> int:
        """Bytes of the message (header, layout if any, the largest piece's data)."""
        return HEADER_BYTES + aligned(len(self.layout_bytes)) + self.data_size


class Preparer:
    """Prepares steps, attaching the layouts only when they differ from the previous step's."""

    def __init__(self) -> None:
        self._last_specs: list[Any] | None = None

    def prepare(self, rows: int, own: Any, laid: Sequence[Laid | None]) -> Prepared:
        """A step of ``rows`` global rows: ``own`` is process 0's piece, ``laid`` every
        process's laid-out piece (``None`` where a process gets nothing)."""
        specs = [item[0] if item is not None else None for item in laid]
        changed = specs != self._last_specs
        self._last_specs = specs
        layout_bytes = pickle.dumps(specs, protocol=pickle.HIGHEST_PROTOCOL) if changed else b""
        tensors = [item[1] if item is not None else [] for item in laid]
        data_size = max((item[2] for item in laid if item is not None), default=0)
        return Prepared(rows, own, specs, tensors, layout_bytes, data_size)
