"""The one rule for a test whose feature this machine may lack: it skips, saying why, only where
the feature cannot exist here, judged from the system alone (its kernel's version, a system
call tried directly), never from nb_accel's own code, whose failure the test must catch; and
never in CI (``CI`` set), where every feature exists and the test fails instead."""

from __future__ import annotations

import ctypes
import os
import platform
import sys

import pytest

#: The userfaultfd system call's number per machine architecture.
_USERFAULTFD = {"x86_64": 323, "aarch64": 282}
#: Its flags: close on exec, and user-mode faults only (allowed without privileges).
_USERFAULTFD_FLAGS = os.O_CLOEXEC | 1


def unavailable(reason: str) -> None:
    """Skip the running test, saying ``reason``; in CI, fail instead."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: the feature must be there)")
    pytest.skip(reason)


def write_tracking_missing() -> str | None:
    """Why this machine cannot track writes to memory (Linux 6.7's ``PAGEMAP_SCAN`` with an
    asynchronous write-protecting userfaultfd, on x86-64 or arm64); ``None`` where it can."""
    if sys.platform != "linux":
        return "write tracking needs Linux"
    number = _USERFAULTFD.get(platform.machine())
    if number is None:
        return f"write tracking needs x86-64 or arm64, not {platform.machine()}"
    release = tuple(int(part) for part in platform.release().split("-")[0].split(".")[:2])
    if release < (6, 7):
        return f"write tracking needs Linux 6.7 or later, not {platform.release()}"
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    fd = int(libc.syscall(ctypes.c_long(number), ctypes.c_int(_USERFAULTFD_FLAGS)))
    if fd < 0:
        return f"userfaultfd is forbidden here ({os.strerror(ctypes.get_errno())})"
    os.close(fd)
    return None


def needs_write_tracking() -> None:
    """Skip the running test where this machine cannot track writes (in CI: fail)."""
    missing = write_tracking_missing()
    if missing is not None:
        unavailable(missing)
