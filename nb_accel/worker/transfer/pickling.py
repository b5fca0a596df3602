"""Pickling whose big buffers travel once, through shared memory, instead of inside the bytes.

:func:`pickle_sharing` pickles with protocol 5: NumPy arrays and other buffer-protocol objects
hand their memory over as out-of-band buffers, and so do tensor storages (see
:func:`storage_reduction`); buffers of at least
:data:`~nb_accel.worker.transfer.segments.SHARE_MIN_BYTES` are kept out of the bytes. The
resulting :class:`Pickled` holds views of the objects' own memory (no copy yet) and is sealed
into bytes for a folder: its big buffers are written once into a segment there and the bytes
name it. :func:`loads` maps the segment copy-on-write: every rank reads the same pages, none
holds a private copy until it writes.

Bytes sealed without big buffers are a plain pickle (``pickle.loads`` reads them).
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ...runtime.device_types.cpu import in_cpu_memory
from .code_files import CodePickler
from .segments import SHARE_MIN_BYTES, map_segment, remove_segment, write_segment

__all__ = [
    "Pickled",
    "SharingCloudPickler",
    "SharingPickler",
    "loads",
    "Place",
    "pickle_sharing",
    "seal_placed",
    "segments_of",
    "storage_reduction",
]

#: The pickle protocol of everything that travels (5: out-of-band buffers).
PROTOCOL = 5

#: How sealed bytes that carry their big buffers aside begin (no pickle begins so).
_MAGIC = b"\x00nb_accel-buffers\x00"

#: Where one big buffer travels: ``(segment file, offset, length)``, or the buffer itself,
#: inside the bytes.
Place = tuple[str, int, int] | pickle.PickleBuffer | bytes | bytearray


def _bytes_of(storage: torch.UntypedStorage) -> Any:
    """A flat, writable byte array on a CPU storage's memory (no copy)."""
    return torch.empty(0, dtype=torch.uint8).set_(storage).numpy()


def _untyped_storage(buffer: Any) -> torch.UntypedStorage:
    """Rebuild an untyped storage on ``buffer`` (no copy when it is writable)."""
    view = memoryview(buffer).cast("B")
    if view.nbytes == 0:
        return torch.UntypedStorage(0)
    if view.readonly:
        view = memoryview(bytearray(view))
    return torch.frombuffer(view, dtype=torch.uint8).untyped_storage()


def _typed_storage(untyped: torch.UntypedStorage, dtype: torch.dtype) -> torch.TypedStorage:
    return torch.TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True)


def storage_reduction(obj: Any) -> Any:
    """How to pickle a CPU tensor storage so that its bytes are one buffer (out of band when
    big, and pickled once however many tensors view it); ``NotImplemented`` for anything else.

    A tensor pickles its storage as a new ``TypedStorage`` each time; reducing that to its
    untyped storage (one object per memory block) lets pickle's memo keep views and tied
    weights sharing one storage.
    """
    if isinstance(obj, torch.TypedStorage):
        untyped = obj._untyped_storage
        if not in_cpu_memory(untyped.device):
            return NotImplemented
        return _typed_storage, (untyped, obj.dtype)
    if isinstance(obj, torch.UntypedStorage) and in_cpu_memory(obj.device):
        return _untyped_storage, (pickle.PickleBuffer(_bytes_of(obj)),)
    return NotImplemented


class SharingPickler(pickle.Pickler):
    """``pickle`` (classes and functions by reference), tensor storages as buffers."""

    def reducer_override(self, obj: Any) -> Any:
        """See :func:`storage_reduction`."""
        return storage_reduction(obj)


class SharingCloudPickler(CodePickler):
    """cloudpickle (the notebook's functions and classes by value, keeping their file names),
    tensor storages as buffers."""

    def reducer_override(self, obj: Any) -> Any:
        """See :func:`storage_reduction`; cloudpickle's own handling for anything else."""
        reduced = storage_reduction(obj)
        return super().reducer_override(obj) if reduced is NotImplemented else reduced


@dataclass(frozen=True)
class Pickled:
    """One pickled object whose big buffers are not in its bytes yet.

    Attributes:
        data: the pickle, without the big buffers.
        buffers: the big buffers (on the objects' own memory), in the order the pickle takes
            them.
    """

    data: bytes
    buffers: tuple[pickle.PickleBuffer, ...]

    def load(self) -> Any:
        """Load a copy of the object in this process; its big buffers are the originals."""
        return pickle.loads(self.data, buffers=self.buffers)

    def seal(self, folder: str | None) -> bytes:
        """The bytes that travel: the big buffers written once into a segment in ``folder``
        and named, or, without a folder or room in it, carried inside the bytes."""
        if not self.buffers:
            return self.data
        written = write_segment(folder, self.buffers) if folder else None
        if written is None:
            return seal_placed(self.data, self.buffers)
        path, spans = written
        return seal_placed(self.data, [(path, offset, length) for offset, length in spans])


def seal_placed(data: bytes, places: Sequence[Place]) -> bytes:
    """The bytes that travel for the pickle ``data`` whose big buffers are at ``places`` (one
    per buffer, in the order the pickle takes them)."""
    if not places:
        return data
    return _MAGIC + pickle.dumps((list(places), data), protocol=PROTOCOL)


def pickle_sharing(obj: Any, pickler: type[pickle.Pickler] = SharingCloudPickler) -> Pickled:
    """Pickle ``obj`` with ``pickler`` (one of this module's, or a subclass), keeping buffers of
    at least :data:`SHARE_MIN_BYTES` out of the bytes. Raises what pickling raises."""
    buffers: list[pickle.PickleBuffer] = []

    def aside(buffer: pickle.PickleBuffer) -> bool:
        # No view of a buffer outlives this call: a memoryview with exports that a garbage
        # cycle reaches can free memory still in use (CPython's memoryview clear).
        try:
            with buffer.raw() as view:
                size = view.nbytes
        except BufferError:  # not contiguous: it stays in the pickle
            return True
        if size < SHARE_MIN_BYTES:
            return True
        buffers.append(buffer)
        return False

    out = io.BytesIO()
    pickler(out, protocol=PROTOCOL, buffer_callback=aside).dump(obj)
    return Pickled(out.getvalue(), tuple(buffers))


def _unseal(data: bytes) -> tuple[list[Place], bytes] | None:
    if not data.startswith(_MAGIC):
        return None
    places, main = pickle.loads(memoryview(data)[len(_MAGIC) :])
    return places, main


def segments_of(data: bytes) -> list[str]:
    """The segment files that sealed ``data`` names, each once."""
    unsealed = _unseal(data)
    if unsealed is None:
        return []
    return list(dict.fromkeys(place[0] for place in unsealed[0] if isinstance(place, tuple)))


def loads(data: bytes, consume: bool = False) -> Any:
    """Load what :meth:`Pickled.seal` or :func:`seal_placed` made (or a plain pickle).

    The big buffers are mapped from their segments, copy-on-write (each file once); with
    ``consume`` (this process is the only reader) the segments' files are removed once mapped.
    """
    unsealed = _unseal(data)
    if unsealed is None:
        return pickle.loads(data)
    places, main = unsealed
    mapped: dict[str, memoryview] = {}
    try:
        buffers: list[Any] = []
        for place in places:
            if isinstance(place, tuple):
                path, offset, length = place
                if path not in mapped:
                    mapped[path] = map_segment(path)
                buffers.append(mapped[path][offset : offset + length])
            else:
                buffers.append(place)
        return pickle.loads(main, buffers=buffers)
    finally:
        if consume:
            for path in mapped:
                remove_segment(path)
