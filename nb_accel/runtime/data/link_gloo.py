"""The dispatcher's portable link: point-to-point messages through the process group.

Works wherever the process group does (several nodes, NCCL). Each message is
``header | layout | data`` in one byte tensor; a message announces the size of the next one,
so every process posts the receive of step ``k + 1`` while it hands out step ``k`` and the
transfer overlaps the loading of the next batch on process 0.
"""

from __future__ import annotations

import pickle
from typing import Any

import torch
import torch.distributed as dist

from ..state import PartialState
from .wire import HEADER_BYTES, Header, Prepared, aligned, pack_into, unpack

__all__ = ["TAG", "GlooSender", "GlooReceiver"]

#: Tag of the dispatcher's point-to-point messages (a user's own use 0 by default).
TAG = 0x6E62


def _comm_device() -> torch.device:
    state = PartialState()
    return state.device_type.collective_device(state.backend, state.device)


class _Buffers:
    """One set of message buffers of process 0, reused once its sends completed."""

    def __init__(self) -> None:
        self.rows: torch.Tensor | None = None
        self.works: list[dist.Work] = []

    def ready(self, parts: int, size: int, device: torch.device) -> torch.Tensor:
        self.wait()
        if self.rows is None or self.rows.shape[1] != size:
            self.rows = torch.empty((parts, size), dtype=torch.uint8, device=device)
        return self.rows

    def wait(self) -> None:
        for work in self.works:
            work.wait()
        self.works = []


class GlooSender:
    """Process 0's end. Two buffer sets alternate, so one message can be in flight while the
    next is written."""

    #: Transfers take a while: send step ``k + 1`` while step ``k`` is handed out.
    sends_ahead = True

    def __init__(self, num_processes: int) -> None:
        self.num_processes = num_processes
        self.device = _comm_device()
        self._buffers = (_Buffers(), _Buffers())
        self._sent = 0

    def begin_epoch(self) -> None:
        """Start an iteration (nothing to do for this link)."""

    def send(self, step: Prepared | None, upcoming: Prepared | None) -> None:
        """Send ``step`` (``None``: the opening message) announcing ``upcoming``."""
        buffers = self._buffers[self._sent % 2]
        self._sent += 1
        size = step.size if step is not None else HEADER_BYTES
        rows = buffers.ready(self.num_processes, size, self.device)
        header = Header(
            epoch=0,
            rows=step.rows if step is not None else -1,
            next_rows=upcoming.rows if upcoming is not None else 0,
            next_size=upcoming.size if upcoming is not None else 0,
            layout_bytes=len(step.layout_bytes) if step is not None else 0,
        )
        encoded = bytearray(header.pack() + (step.layout_bytes if step is not None else b""))
        rows[:, : len(encoded)] = torch.frombuffer(encoded, dtype=torch.uint8).to(self.device)
        if step is not None:
            start = HEADER_BYTES + aligned(len(step.layout_bytes))
            for rank in range(1, self.num_processes):  # process 0 keeps its own piece
                if step.specs[rank] is not None:
                    pack_into(rows[rank], step.specs[rank], step.tensors[rank], start)
        for rank in range(1, self.num_processes):
            work = dist.isend(rows[rank], dst=rank, tag=TAG)
            assert work is not None
            buffers.works.append(work)

    def drain(self) -> None:
        """Wait until every message sent has arrived."""
        for buffers in self._buffers:
            buffers.wait()

    def close(self) -> None:
        """Nothing to release."""


class GlooReceiver:
    """Every other process's end: the receive of the next message is posted ahead of time."""

    def __init__(self, process_index: int) -> None:
        self.process_index = process_index
        self.device = _comm_device()
        self.specs: list[Any] | None = None
        self._pending: tuple[dist.Work, torch.Tensor] | None = None

    def _post(self, size: int) -> None:
        buffer = torch.empty(size, dtype=torch.uint8, device=self.device)
        work = dist.irecv(buffer, src=0, tag=TAG)
        assert work is not None
        self._pending = (work, buffer)

    def begin_epoch(self) -> None:
        """Start an iteration: post the receive of its opening message."""
        self.drain()
        self._post(HEADER_BYTES)

    def take(self) -> tuple[Any, int, int]:
        """The next step: ``(piece, rows, next_rows)`` (see ``LocalReceiver.take``)."""
        assert self._pending is not None
        work, buffer = self._pending
        self._pending = None
        work.wait()
        header = Header.unpack(bytes(buffer[:HEADER_BYTES].cpu().tolist()))
        if header.next_rows > 0:
            self._post(header.next_size)
        if header.layout_bytes:
            end = HEADER_BYTES + header.layout_bytes
            self.specs = pickle.loads(bytes(buffer[HEADER_BYTES:end].cpu().tolist()))
        spec = self.specs[self.process_index] if self.specs is not None else None
        if header.rows < 0 or spec is None:
            return None, header.rows, header.next_rows
        start = HEADER_BYTES + aligned(header.layout_bytes)
        return unpack(spec, buffer, start), header.rows, header.next_rows

    def drain(self) -> None:
        """Wait for a message still on its way (after an abandoned iteration)."""
        if self._pending is not None:
            self._pending[0].wait()
            self._pending = None

    def close(self) -> None:
        """Nothing to release."""
