"""``breakpoint()``, ``pdb.set_trace()``, ``torch.distributed.breakpoint()`` and ``input()`` in
a worker, answered in the notebook.

Where the kernel answers its ranks' prompts (a launch or pool on this machine says so with
:data:`PROMPTS_VARIABLE`), :func:`install_prompts` makes each of them ask through the rank's
event channel: a breakpoint opens :class:`~.remote_pdb.ChannelPdb` on the caller's frame, its
prompt naming the rank; ``input()`` asks with ``[rank N]`` before the prompt. The kernel
serves one prompt at a time. Ranks without a debugger go on until they need the one that is
stopped (a collective), as with pdb anywhere; ``torch.distributed.breakpoint()`` keeps the other
ranks at its barrier until the stopped rank is resumed by any command (``c``, ``n``, ``s``,
``r``, ``unt``, ``q``).
"""

from __future__ import annotations

import bdb
import builtins
import os
import pdb
import sys
from datetime import timedelta
from types import FrameType
from typing import Any

from ..reporting.channel import EventChannel
from .remote_pdb import ChannelPdb, ask_kernel, frame_place

__all__ = ["PROMPTS_VARIABLE", "DebuggerQuit", "install_prompts", "quit_explained"]

#: Set to ``"1"`` in a worker whose kernel answers its prompts.
PROMPTS_VARIABLE = "NB_ACCEL_PROMPTS"

#: Modules a debugger opened by ``torch.distributed.breakpoint()`` does not stop in.
_NOT_STOPPED_IN = ("nb_accel.*", "torch.distributed.*", "torch._C*")


class DebuggerQuit(bdb.BdbQuit):
    """``q`` in a worker's debugger: the launch or cell ends with this error."""


def quit_explained(error: BaseException, rank: int) -> BaseException:
    """``error``, or, for pdb's own ``BdbQuit`` (``q`` typed), a :class:`DebuggerQuit` that
    says so (without pdb's frames)."""
    if not isinstance(error, bdb.BdbQuit) or isinstance(error, DebuggerQuit):
        return error
    return DebuggerQuit(f"q in the debugger on rank {rank} ended the run (c continues instead)")


class _HeldPdb(ChannelPdb):
    """A debugger that, on ``torch.distributed.breakpoint()``, keeps the other ranks at the
    barrier until this rank is resumed: the first command that resumes it runs the barrier
    first."""

    def __init__(self, channel: EventChannel) -> None:
        super().__init__(channel, skip=_NOT_STOPPED_IN)
        self._waiting = True  # the other ranks are at the barrier
        self._prompted = False

    def interaction(self, frame: FrameType | None, traceback: Any) -> None:
        """Note that the user has the prompt (commands from now on resume this rank)."""
        self._prompted = True
        super().interaction(frame, traceback)

    def _let_others_go(self) -> None:
        if self._waiting and self._prompted:
            self._waiting = False
            tracer = sys.gettrace()
            sys.settrace(None)  # the barrier is not the user's code to step through
            try:
                import torch.distributed as dist

                dist.barrier()
            finally:
                sys.settrace(tracer)

    def set_continue(self) -> None:
        self._let_others_go()
        super().set_continue()

    def set_step(self) -> None:
        self._let_others_go()
        super().set_step()

    def set_next(self, frame: FrameType) -> None:
        self._let_others_go()
        super().set_next(frame)

    def set_return(self, frame: FrameType) -> None:
        self._let_others_go()
        super().set_return(frame)

    def set_quit(self) -> None:
        self._let_others_go()
        super().set_quit()


class _Prompts:
    """The replacements, bound to the rank's channel."""

    def __init__(self, channel: EventChannel) -> None:
        self.channel = channel
        self._skipped: dict[tuple[str, int], int] = {}

    def input(self, prompt: object = "") -> str:
        """``input()``: the line typed in the notebook."""
        sys.stdout.flush()
        sys.stderr.flush()
        rank = self.channel.rank
        caller = frame_place(sys._getframe(1))
        line = ask_kernel(self.channel, f"[rank {rank}] {prompt}", where=caller)
        if line is None:
            raise EOFError(
                f"input() on rank {rank} got no answer: the notebook's front end takes no "
                "input here; pass the value to the function instead"
            )
        return line

    def breakpoint(self, *args: Any, **kwargs: Any) -> Any:
        """``breakpoint()``: the debugger on the caller's frame (``PYTHONBREAKPOINT`` is
        honoured: ``0`` skips it, another hook is called)."""
        chosen = os.environ.get("PYTHONBREAKPOINT")
        if chosen == "0":
            return None
        if chosen:
            return sys.__breakpointhook__(*args, **kwargs)
        ChannelPdb(self.channel).set_trace(sys._getframe(1))
        return None

    def set_trace(self, *, header: str | None = None) -> None:
        """``pdb.set_trace()``: the debugger on the caller's frame."""
        debugger = ChannelPdb(self.channel)
        if header is not None:
            debugger.message(header)
        debugger.set_trace(sys._getframe(1))

    def distributed_breakpoint(
        self, rank: int = 0, skip: int = 0, timeout_s: float | None = 3600
    ) -> None:
        """``torch.distributed.breakpoint()``: the debugger on ``rank`` at the caller's next
        line, the other ranks held at a barrier until it is resumed; the first ``skip`` calls
        from the same line are let through; the process group's timeout becomes ``timeout_s``
        (as torch's does: a short one would end the session)."""
        import torch.distributed as dist

        from ...runtime.process_group import set_group_timeout

        caller = sys._getframe(1)
        if skip > 0:
            place = (caller.f_code.co_filename, caller.f_lineno)
            self._skipped[place] = self._skipped.get(place, 0) + 1
            if self._skipped[place] <= skip:
                return
        if timeout_s is not None:
            set_group_timeout(timedelta(seconds=timeout_s))
        if dist.get_rank() != rank:
            dist.barrier()  # until the debugged rank is resumed
            return
        _HeldPdb(self.channel).set_trace(caller)


def install_prompts(channel: EventChannel) -> None:
    """Make ``input()``, ``breakpoint()``, ``pdb.set_trace()`` and
    ``torch.distributed.breakpoint()`` ask in the notebook, where the kernel answers (see the
    module); elsewhere leave them as they are."""
    if os.environ.get(PROMPTS_VARIABLE) != "1":
        return
    prompts = _Prompts(channel)
    builtins.input = prompts.input
    sys.breakpointhook = prompts.breakpoint
    pdb.set_trace = prompts.set_trace
    import torch.distributed as dist

    dist.breakpoint = prompts.distributed_breakpoint
