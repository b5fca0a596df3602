"""Asking a child forked from this process what it finds about CUDA, never this process itself.

A child forked after its parent initialised the CUDA driver cannot use CUDA, and torch's own
flag for that, ``torch.cuda.is_initialized()``, stays ``False`` after the commonest culprit:
``torch.cuda.is_available()`` (it calls ``cudaGetDeviceCount``, which initialises the driver
without torch's state). Only a forked child can tell for sure: torch marks it a *bad fork* when
the parent touched CUDA through torch, and its CUDA runtime counts no device when the parent
initialised the driver some other way. The child asks, writes its answer to a pipe and exits;
whatever CUDA does in the child stays there.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import warnings
from dataclasses import dataclass

__all__ = ["ForkedCuda", "PROBE_TIMEOUT_S", "ask_forked_child", "driver_loaded"]

#: How long the forked child may take to answer (initialising the driver of a machine with
#: many GPUs can take seconds), in seconds.
PROBE_TIMEOUT_S = 60.0

_BAD_FORK = b"bad-fork"


@dataclass(frozen=True)
class ForkedCuda:
    """What a child forked from this process found.

    Attributes:
        bad_fork: torch flags the child a bad fork: this process initialised CUDA through torch.
        device_count: the devices the CUDA runtime counts in the child (0 there when the driver
            was initialised in this process by anything else); -1 when not counted (a bad fork,
            or a torch built without CUDA).
    """

    bad_fork: bool
    device_count: int


def driver_loaded() -> bool:
    """True when the CUDA driver library (``libcuda``) is mapped into this process, or when that
    cannot be read. Without it nothing here can have initialised CUDA, so no child need be asked.
    """
    try:
        with open("/proc/self/maps") as maps:
            return any("/libcuda.so" in line for line in maps)
    except OSError:
        return True


def _answer() -> bytes:
    """The child's answer (runs in the forked child only)."""
    import torch

    if torch.cuda._is_in_bad_fork():
        return _BAD_FORK
    counter = getattr(torch._C, "_cuda_getDeviceCount", None)
    return str(counter() if counter is not None else -1).encode()


def _answer_and_exit(read_fd: int, write_fd: int) -> None:
    """The forked child: answer on ``write_fd`` and leave at once (no exit handler, no flush of
    buffers copied from the parent). CUDA's warnings go nowhere."""
    code = 1
    try:
        os.close(read_fd)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        warnings.simplefilter("ignore")
        os.write(write_fd, _answer())
        code = 0
    finally:
        os._exit(code)


def _parse(data: bytes) -> ForkedCuda | None:
    if data == _BAD_FORK:
        return ForkedCuda(bad_fork=True, device_count=-1)
    try:
        return ForkedCuda(bad_fork=False, device_count=int(data))
    except ValueError:
        return None


def ask_forked_child(timeout_s: float = PROBE_TIMEOUT_S) -> ForkedCuda | None:
    """Fork a child, let it look at CUDA and report; ``None`` when it gave no answer in time
    (or crashed). This process's CUDA state is left exactly as it was."""
    read_fd, write_fd = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork of a multi-threaded process
        pid = os.fork()
    if pid == 0:
        _answer_and_exit(read_fd, write_fd)
    os.close(write_fd)
    data = b""
    try:
        ready, _, _ = select.select([read_fd], [], [], timeout_s)
        if ready:
            data = os.read(read_fd, 64)
    finally:
        os.close(read_fd)
        if not data:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return _parse(data)
