"""The dispatcher's single-node link: a shared-memory ring plus a Unix socket per process.

When every process runs on one Linux machine on the CPU, process 0 writes each process's piece
into a ring of shared memory (an anonymous ``memfd``, handed over with ``SCM_RIGHTS``) and sends
only the header (and the layout when it changed) over a Unix socket in the abstract namespace:
no files, no ports; process 0 admits only this launch's processes (checked by pid and uid). A
receiving process copies its piece out and acknowledges it, which frees the ring slot. Data
cross in one copy each way instead of through TCP; see :mod:`~nb_accel.runtime.data.link_gloo` for
the portable link.
"""

from __future__ import annotations

import mmap
import os
import pickle
import secrets
import socket
import struct
import sys
import warnings
from typing import Any

import torch

from ..collectives.ops import broadcast_object_list, gather_object
from ..device_types.cpu import in_cpu_memory
from ..device_types.group_backends import cpu_collectives_only
from ..state import PartialState
from .wire import HEADER_BYTES, Header, Prepared, pack_targets, spec_bytes, unpack, write_packed

__all__ = [
    "SLOTS",
    "RING_BUDGET",
    "local_link_available",
    "peer_credentials",
    "accept_peers",
    "connect_local",
    "LocalSender",
    "LocalReceiver",
]

#: Messages that may be in the ring at once (fewer when pieces are huge: see RING_BUDGET).
SLOTS = 4
#: Bytes the ring may take before it holds fewer than SLOTS messages (never fewer than 2).
RING_BUDGET = 256 * 2**20
_GONE = (
    "process 0 of the dispatched data loader went away (it stopped iterating or exited); "
    "every process must iterate a dispatched loader the same number of times"
)
#: ``struct ucred`` as ``SO_PEERCRED`` returns it: pid, uid, gid.
_CREDENTIALS = struct.Struct("3i")


def local_link_available(state: PartialState) -> bool:
    """True when every process runs on this machine's CPU under Linux (gloo backend)."""
    return (
        sys.platform.startswith("linux")
        and hasattr(os, "memfd_create")
        and hasattr(socket, "send_fds")
        and hasattr(socket, "SO_PEERCRED")
        and cpu_collectives_only(state.backend)
        and in_cpu_memory(state.device)
        and state.num_local_processes == state.num_processes
    )


def peer_credentials(peer: socket.socket) -> tuple[int, int]:
    """``(pid, effective uid)`` of the process at the other end of a connected Unix socket."""
    pid, uid, _ = _CREDENTIALS.unpack(
        peer.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size)
    )
    return pid, uid


def accept_peers(listener: socket.socket, pids: list[int]) -> dict[int, socket.socket]:
    """Process 0: one connection from each other process, ``{rank: socket}``.

    The abstract socket's name can be read by any local user (``/proc/net/unix``), so a
    connection is known by its kernel-given credentials: it must come from the pid of one of
    this launch's processes (``pids[rank]``), running as this user. Others are refused.
    """
    expected = {pid: rank for rank, pid in enumerate(pids) if rank != 0}
    peers: dict[int, socket.socket] = {}
    while len(peers) < len(expected):
        peer, _ = listener.accept()
        pid, uid = peer_credentials(peer)
        rank = expected.get(pid)
        if rank is None or rank in peers or uid != os.geteuid():
            peer.close()
            warnings.warn(
                f"the data loader's link refused a connection from pid {pid} (uid {uid}): "
                "not one of this launch's processes",
                RuntimeWarning,
                stacklevel=2,
            )
            continue
        peers[rank] = peer
    return peers


def connect_local(state: PartialState) -> dict[int, socket.socket] | socket.socket:
    """Connect every process to process 0 (collective). Process 0 gets ``{rank: socket}``."""
    if state.process_index != 0:
        name = broadcast_object_list([None])[0]
        pids = [int(pid) for pid in gather_object([os.getpid()])]
        peer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        peer.connect(name)
        if peer_credentials(peer) != (pids[0], os.geteuid()):
            peer.close()
            raise ConnectionError("the data loader's link reached a process other than process 0")
        return peer
    name = f"\0nb_accel-dispatch-{os.getpid()}-{secrets.token_hex(8)}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(name)
        listener.listen(state.num_processes)
        broadcast_object_list([name])
        return accept_peers(listener, [int(pid) for pid in gather_object([os.getpid()])])


def _read(peer: socket.socket, size: int) -> bytes:
    chunks = b""
    while len(chunks) < size:
        chunk = peer.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError(_GONE)
        chunks += chunk
    return chunks


def _map(fd: int, size: int) -> tuple[mmap.mmap, torch.Tensor]:
    ring = mmap.mmap(fd, size)
    return ring, torch.frombuffer(ring, dtype=torch.uint8)


class LocalSender:
    """Process 0's end: writes pieces into the ring and sends their headers."""

    #: Transfers are quick: send each step when it is handed out.
    sends_ahead = False

    def __init__(self, peers: dict[int, socket.socket]) -> None:
        self.peers = peers
        self.epoch = 0
        self._sent = 0
        self._acked = dict.fromkeys(peers, 0)
        self._region = 0
        self._slots = SLOTS
        self._ring: tuple[mmap.mmap, torch.Tensor] | None = None
        #: (slot, region index) -> (layout, its tensors' places there): layouts repeat.
        self._targets: dict[tuple[int, int], tuple[Any, list[torch.Tensor]]] = {}

    def begin_epoch(self) -> None:
        """Start an iteration; messages of an abandoned one are told apart by the epoch."""
        self.epoch += 1

    def _await_acks(self, count: int) -> None:
        for rank, peer in self.peers.items():
            while self._acked[rank] < count:
                data = peer.recv(4096)
                if not data:
                    raise ConnectionError(
                        f"process {rank} of the dispatched data loader went away (it stopped "
                        "iterating or exited); every process must iterate a dispatched loader "
                        "the same number of times"
                    )
                self._acked[rank] += len(data)

    def _grow(self, region: int) -> int:
        """Replace the ring with one whose regions hold ``region`` bytes; returns its fd."""
        self._await_acks(self._sent)  # nothing in the old ring is still to be read
        self._region = max(region, 2 * self._region)
        per_slot = len(self.peers) * self._region
        self._slots = max(2, min(SLOTS, RING_BUDGET // per_slot))
        fd = os.memfd_create("nb_accel-dispatch", os.MFD_CLOEXEC)
        os.ftruncate(fd, self._slots * per_slot)
        self._ring = _map(fd, self._slots * per_slot)
        self._targets.clear()
        return fd

    def _places(self, slot: int, index: int, spec: Any) -> list[torch.Tensor]:
        """The views of the ring where a piece laid out as ``spec`` goes in a slot's region."""
        known = self._targets.get((slot, index))
        if known is not None and known[0] is spec:
            return known[1]
        assert self._ring is not None
        start = (slot * len(self.peers) + index) * self._region
        targets = pack_targets(self._ring[1], spec, start)
        self._targets[(slot, index)] = (spec, targets)
        return targets

    def send(self, step: Prepared | None, upcoming: Prepared | None) -> None:
        """Send ``step`` (``None``: the opening message) announcing ``upcoming``."""
        fd = self._grow(step.data_size) if step and step.data_size > self._region else None
        slot = self._sent % self._slots
        self._await_acks(self._sent - self._slots + 1)
        layout_bytes = step.layout_bytes if step is not None else b""
        header = Header(
            epoch=self.epoch,
            rows=step.rows if step is not None else -1,
            next_rows=upcoming.rows if upcoming is not None else 0,
            next_size=0,
            layout_bytes=len(layout_bytes),
            slot=slot,
            region=self._region,
            ring_bytes=self._slots * len(self.peers) * self._region if fd is not None else 0,
        )
        message = header.pack() + layout_bytes
        try:
            for index, (rank, peer) in enumerate(sorted(self.peers.items())):
                if step is not None and step.specs[rank] is not None and self._ring is not None:
                    places = self._places(slot, index, step.specs[rank])
                    write_packed(places, step.tensors[rank])
                sent = socket.send_fds(peer, [message], [fd]) if fd is not None else 0
                peer.sendall(message[sent:])
        finally:
            if fd is not None:
                os.close(fd)  # the mapping (and the receivers' copies of the fd) keep it alive
        self._sent += 1

    def drain(self) -> None:
        """Nothing to wait for: receivers discard what an abandoned iteration left."""

    def close(self) -> None:
        """Close the sockets (the ring goes with the last mapping)."""
        for peer in self.peers.values():
            peer.close()


class LocalReceiver:
    """Every other process's end: reads headers, copies its piece out, acknowledges."""

    def __init__(self, peer: socket.socket, process_index: int, num_processes: int) -> None:
        self.peer = peer
        self.process_index = process_index
        self.index = sorted(r for r in range(num_processes) if r != 0).index(process_index)
        self.receivers = num_processes - 1
        self.epoch = 0
        self.specs: list[Any] | None = None
        self._ring: tuple[mmap.mmap, torch.Tensor] | None = None

    def begin_epoch(self) -> None:
        """Start an iteration."""
        self.epoch += 1

    def _header(self) -> Header:
        try:
            data, fds, _, _ = socket.recv_fds(self.peer, HEADER_BYTES, 1)
        except ConnectionResetError:
            data, fds = b"", []
        if not data:
            raise ConnectionError(_GONE)
        header = Header.unpack(data + _read(self.peer, HEADER_BYTES - len(data)))
        if fds:
            self._ring = _map(fds[0], header.ring_bytes)
            os.close(fds[0])
        if header.layout_bytes:
            self.specs = pickle.loads(_read(self.peer, header.layout_bytes))
        return header

    def _copy_out(self, header: Header, spec: Any) -> torch.Tensor:
        """This process's piece of the ring slot of ``header``, copied out (only the bytes
        its layout ``spec`` uses; empty before any ring)."""
        if self._ring is None:  # every piece so far had zero bytes
            return torch.empty(0, dtype=torch.uint8)
        start = (header.slot * self.receivers + self.index) * header.region
        return self._ring[1][start : start + spec_bytes(spec)].clone()

    def take(self) -> tuple[Any, int, int]:
        """The next step of this iteration: ``(piece, rows, next_rows)``.

        ``piece`` is this process's share (``None`` when it has none, or in the opening
        message, whose ``rows`` is -1); ``next_rows`` the next step's global batch size (0:
        this was the last step).
        """
        while True:
            header = self._header()
            spec = self.specs[self.process_index] if self.specs is not None else None
            piece = None
            if header.epoch == self.epoch and header.rows >= 0 and spec is not None:
                piece = unpack(spec, self._copy_out(header, spec), 0)
            try:
                self.peer.sendall(b"\x01")  # read: its slot is free again
            except (BrokenPipeError, ConnectionResetError):
                pass  # process 0 has finished with this loader and closed the link
            if header.epoch == self.epoch:
                return piece, header.rows, header.next_rows

    def drain(self) -> None:
        """Nothing to wait for (the next iteration skips what is left of this one)."""

    def close(self) -> None:
        """Close the socket."""
        self.peer.close()
