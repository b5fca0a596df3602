"""Whether memory of this process was written since a moment: Linux's write tracking, used to
send an unchanged buffer to the workers only once.

A range is watched through a userfaultfd in asynchronous write-protect mode: the kernel marks
each page of it write-protected, and the first write to a page (by any thread, by NumPy, by a
``read()`` into it, by anything) lifts the protection without stopping the writer; the
``PAGEMAP_SCAN`` ioctl then reports whether any page of the range was written. Nothing is
copied, hashed or compared, and a changed byte is never missed. A range whose memory was freed
(and maybe allocated again) is no longer watched, which counts as written.

This needs Linux 6.7 or later on x86-64 or arm64 with userfaultfd allowed (some container
sandboxes forbid it); :func:`open_write_watch` returns ``None`` elsewhere, and callers then
treat every buffer as changed.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import sys

__all__ = ["WriteWatch", "open_write_watch"]

#: The userfaultfd system call's number per machine architecture.
_USERFAULTFD = {"x86_64": 323, "aarch64": 282}

_UFFD_USER_MODE_ONLY = 1
_UFFD_API = 0xAA
_UFFD_FEATURE_WP_UNPOPULATED = 1 << 13
_UFFD_FEATURE_WP_ASYNC = 1 << 15
_UFFDIO_REGISTER_MODE_WP = 1 << 1
_UFFDIO_WRITEPROTECT_MODE_WP = 1 << 0

# ioctl request numbers: _IOWR / _IOR of the structures below (the same on x86-64 and arm64).
_UFFDIO_API = 0xC018AA3F  # struct uffdio_api: api, features, ioctls
_UFFDIO_REGISTER = 0xC020AA00  # struct uffdio_register: start, len, mode, ioctls
_UFFDIO_UNREGISTER = 0x8010AA01  # struct uffdio_range: start, len
_UFFDIO_WRITEPROTECT = 0xC018AA06  # struct uffdio_writeprotect: start, len, mode
_PAGEMAP_SCAN = 0xC0606610  # struct pm_scan_arg: 12 x u64

_PM_SCAN_CHECK_WPASYNC = 1 << 1
_PAGE_IS_WPALLOWED = 1 << 0
_PAGE_IS_WRITTEN = 1 << 1

_U64 = ctypes.c_uint64


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    libc.syscall.restype = ctypes.c_long
    libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
    libc.ioctl.restype = ctypes.c_int
    return libc


class WriteWatch:
    """Watches ranges of this process's memory for writes (see the module's description).

    Args:
        libc: the C library, for its ``ioctl``.
        uffd: an open userfaultfd in asynchronous write-protect mode.
        pagemap: ``/proc/self/pagemap``, open for reading.
    """

    def __init__(self, libc: ctypes.CDLL, uffd: int, pagemap: int) -> None:
        self._libc = libc
        self._uffd = uffd
        self._pagemap = pagemap
        self._found = (_U64 * 6)()  # two page_regions: start, end, categories

    def _ioctl(self, fd: int, request: int, arg: ctypes.Array[ctypes.c_uint64]) -> int:
        """The ioctl's result: negative when it failed (or the watch is closed)."""
        if self._uffd < 0:
            return -1
        result: int = self._libc.ioctl(fd, request, ctypes.addressof(arg))
        return result

    @staticmethod
    def _pages(address: int, nbytes: int) -> tuple[int, int]:
        start = address - address % mmap.PAGESIZE
        end = -(-(address + max(nbytes, 1)) // mmap.PAGESIZE) * mmap.PAGESIZE
        return start, end

    def watch(self, address: int, nbytes: int) -> bool:
        """Start watching ``nbytes`` at ``address`` (from now on, a write to it counts);
        ``False`` where this memory cannot be watched (a mapped file, for one)."""
        start, end = self._pages(address, nbytes)
        register = (_U64 * 4)(start, end - start, _UFFDIO_REGISTER_MODE_WP, 0)
        protect = (_U64 * 3)(start, end - start, _UFFDIO_WRITEPROTECT_MODE_WP)
        if (
            self._ioctl(self._uffd, _UFFDIO_REGISTER, register) < 0
            or self._ioctl(self._uffd, _UFFDIO_WRITEPROTECT, protect) < 0
        ):
            self.forget(address, nbytes)
            return False
        return True

    def written(self, address: int, nbytes: int) -> bool:
        """Whether any byte of the range was written since :meth:`watch`, or some of it is
        not watched any more (its memory was freed, maybe allocated again, or
        :meth:`forget` was called)."""
        start, end = self._pages(address, nbytes)
        scan = (_U64 * 12)(
            96,  # the structure's size
            _PM_SCAN_CHECK_WPASYNC,
            start,
            end,
            0,  # walk_end, set by the kernel
            ctypes.addressof(self._found),
            2,  # room for two regions: one means the whole range reads alike
            0,  # no limit on pages
            0,  # no category inverted
            _PAGE_IS_WPALLOWED,  # watched pages only (freed memory has none) ...
            0,
            _PAGE_IS_WPALLOWED | _PAGE_IS_WRITTEN,  # ... and whether each was written
        )
        regions = self._ioctl(self._pagemap, _PAGEMAP_SCAN, scan)
        first_start, first_end, categories = self._found[0], self._found[1], self._found[2]
        whole = regions == 1 and first_start == start and first_end == end
        return not (whole and categories == _PAGE_IS_WPALLOWED)

    def forget(self, address: int, nbytes: int) -> None:
        """Stop watching the range (its pages writable as before); unwatched already is fine."""
        start, end = self._pages(address, nbytes)
        self._ioctl(self._uffd, _UFFDIO_UNREGISTER, (_U64 * 2)(start, end - start))

    def close(self) -> None:
        """Stop watching everything and close the descriptors; closing twice is fine."""
        if self._uffd >= 0:
            os.close(self._uffd)
            os.close(self._pagemap)
            self._uffd = self._pagemap = -1


def open_write_watch() -> WriteWatch | None:
    """A :class:`WriteWatch` for this process, or ``None`` where the system has no write
    tracking usable here (not Linux 6.7+ on x86-64 or arm64, or userfaultfd forbidden)."""
    number = _USERFAULTFD.get(os.uname().machine) if sys.platform == "linux" else None
    libc = _libc() if number is not None else None
    if libc is None or number is None:
        return None
    flags = os.O_CLOEXEC | os.O_NONBLOCK | _UFFD_USER_MODE_ONLY
    uffd = int(libc.syscall(ctypes.c_long(number), ctypes.c_int(flags)))
    if uffd < 0:
        return None
    features = _UFFD_FEATURE_WP_ASYNC | _UFFD_FEATURE_WP_UNPOPULATED
    api = (_U64 * 3)(_UFFD_API, features, 0)
    pagemap = -1
    if libc.ioctl(uffd, _UFFDIO_API, ctypes.addressof(api)) == 0:
        with contextlib.suppress(OSError):
            pagemap = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
    if pagemap < 0:
        os.close(uffd)
        return None
    watch = WriteWatch(libc, uffd, pagemap)
    if not _scan_works(watch):  # PAGEMAP_SCAN is Linux 6.7's
        watch.close()
        return None
    return watch


def _scan_works(watch: WriteWatch) -> bool:
    """Whether ``PAGEMAP_SCAN`` answers on this kernel: a watched, untouched page reads as
    not written, and a written one as written."""
    probe = mmap.mmap(-1, mmap.PAGESIZE)
    try:
        cell = ctypes.c_char.from_buffer(probe)
        address = ctypes.addressof(cell)
        del cell  # no export of the mapping left: it can be closed
        try:
            if not watch.watch(address, 1) or watch.written(address, 1):
                return False
            probe[0] = 1
            return watch.written(address, 1)
        finally:
            watch.forget(address, 1)
    finally:
        probe.close()
