"""The frames where a persistent worker's last command raised, kept for a post-mortem.

A ``%%distributed`` cell or launch that raises leaves its traceback here (the frames, and every
local in them, stay alive until the rank's next failure); a cold launch's worker then waits for
the kernel (:func:`wait_for_post_mortem`) instead of exiting. :func:`debug_failure` opens
:class:`~.remote_pdb.ChannelPdb` on them, starting where the exception was raised, with the
user's own frames only (nb_accel's are left out).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from types import TracebackType

from ..._messages import Debug, Stop, decode_command
from ..reporting.channel import EventChannel
from .remote_pdb import ChannelPdb

__all__ = [
    "NothingToDebugError",
    "debug_failure",
    "has_failure",
    "keep_failure",
    "wait_for_post_mortem",
]

_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep


class NothingToDebugError(LookupError):
    """The rank has no failure of that command to inspect."""


@dataclass
class _Kept:
    cell: int
    traceback: TracebackType


#: The frames of this worker's last failure, under ``"last"``.
_kept: dict[str, _Kept] = {}


def _users_part(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` from the first frame that is not nb_accel's (all of it if every frame is)."""
    first = tb
    while tb is not None:
        if not os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_PACKAGE):
            return tb
        tb = tb.tb_next
    return first


def keep_failure(cell: int, error: BaseException) -> None:
    """Keep the frames where command ``cell`` raised ``error`` (the previous ones are let go)."""
    tb = _users_part(error.__traceback__)
    _kept.pop("last", None)
    if tb is not None:
        _kept["last"] = _Kept(cell, tb)


def has_failure() -> bool:
    """Whether this worker keeps the frames of a failure."""
    return "last" in _kept


def wait_for_post_mortem(channel: EventChannel, limit_s: float) -> None:
    """After the launch's function raised here: wait, paused (no CPU used), for the kernel to
    open the debugger on these frames (:class:`~nb_accel._messages.Debug`) and run it; return
    when it ends, when the kernel says to stop or goes away, or after ``limit_s`` seconds."""
    deadline = time.monotonic() + limit_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not channel.poll(left):
            return
        try:
            message = decode_command(channel.receive())
        except EOFError:
            return
        if isinstance(message, Stop):
            return
        if isinstance(message, Debug):
            with contextlib.suppress(NothingToDebugError):
                debug_failure(channel, message.failed_cell)
            return


def debug_failure(channel: EventChannel, cell: int) -> None:
    """Run the debugger on the frames where command ``cell`` raised, until the user quits or
    continues."""
    kept = _kept.get("last")
    if kept is None or kept.cell != cell:
        raise NothingToDebugError(
            f"rank {channel.rank} keeps no frames of that failure: a later command failed on "
            "it since, or the workers were started again"
        )
    debugger = ChannelPdb(channel)
    debugger.reset()
    debugger.interaction(None, kept.traceback)
