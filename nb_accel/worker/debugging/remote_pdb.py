"""pdb in a worker, typed at from the notebook.

:class:`ChannelPdb` is the standard library's ``pdb.Pdb`` with one difference: it reads and
writes through :class:`PromptStream`, which sends what pdb writes to the kernel as the rank's
output and, when pdb reads a line, sends the prompt (:class:`~nb_accel._messages.Prompt`) and
waits for the kernel's :class:`~nb_accel._messages.Answer`. Every pdb command works as in a
terminal; the prompt names the rank.
"""

from __future__ import annotations

import pdb
from collections.abc import Callable
from types import FrameType

from ..._messages import Answer, Output, Prompt, decode_command
from ..reporting.channel import EventChannel

__all__ = ["ChannelPdb", "PromptStream", "Where", "ask_kernel", "frame_place", "pdb_prompt"]

#: A frame as a prompt names it: its file, line and function.
Where = tuple[str, int, str]


def frame_place(frame: FrameType | None) -> Where | None:
    """Where ``frame`` is, for a :class:`~nb_accel._messages.Prompt` (``None``: unknown)."""
    if frame is None:
        return None
    return frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name


def ask_kernel(
    channel: EventChannel, prompt: str, debugger: bool = False, where: Where | None = None
) -> str | None:
    """The line typed in the notebook at ``prompt`` (``None``: the kernel has none to give,
    as at the end of a file); ``debugger``: pdb asks, at ``where`` (else ``input()``, called
    there)."""
    channel.send(Prompt(channel.rank, prompt, debugger, where))
    try:
        answer = decode_command(channel.receive())
    except EOFError:  # the kernel has gone
        return None
    return answer.text if isinstance(answer, Answer) else None


def pdb_prompt(rank: int) -> str:
    """The debugger's prompt on ``rank``."""
    return f"(Pdb rank {rank}) "


class PromptStream:
    """pdb's stdin and stdout over the rank's event channel (a text stream pdb reads lines
    from and writes to).

    Args:
        channel: the rank's event channel.
        where: the frame the debugger is at when it reads a line (for the prompt to say).
    """

    def __init__(
        self, channel: EventChannel, where: Callable[[], Where | None] = lambda: None
    ) -> None:
        self._channel = channel
        self._where = where
        self._pending = ""

    def write(self, text: str) -> int:
        """Keep ``text`` until the next newline or prompt."""
        self._pending += text
        if "\n" in self._pending:
            shown, _, self._pending = self._pending.rpartition("\n")
            self._send(shown + "\n")
        return len(text)

    def _send(self, text: str) -> None:
        if text:
            self._channel.send(Output(self._channel.rank, "stdout", text, debugger=True))

    def flush(self) -> None:
        """Nothing to do: lines go out as they end, the prompt with the next read."""

    def readline(self) -> str:
        """The next line the notebook's user types (``""`` when there is none: pdb's end of
        input, which ends the debugger)."""
        prompt, self._pending = self._pending, ""
        line = ask_kernel(self._channel, prompt, debugger=True, where=self._where())
        return "" if line is None else line + "\n"  # "": the end of input

    def isatty(self) -> bool:
        """Not a terminal."""
        return False


def _standard_pdb() -> type[pdb.Pdb]:
    """The standard library's ``pdb.Pdb``, also where a kernel put IPython's debugger in its
    place (ipykernel does, and forked workers inherit it: IPython 7's would make a terminal
    shell in the worker, which writes the terminal's title into the rank's output)."""
    for cls in pdb.Pdb.__mro__:
        if cls.__module__ == "pdb" and cls.__name__ == "Pdb":
            return cls
    return pdb.Pdb


class ChannelPdb(_standard_pdb()):  # type: ignore[misc]
    """pdb whose prompts are answered in the notebook (see the module).

    Args:
        channel: the rank's event channel.
    """

    def __init__(self, channel: EventChannel, skip: tuple[str, ...] = ()) -> None:
        stream = PromptStream(channel, lambda: frame_place(getattr(self, "curframe", None)))
        super().__init__(
            stdin=stream,  # type: ignore[arg-type]
            stdout=stream,  # type: ignore[arg-type]
            nosigint=True,
            skip=skip or None,
        )
        self.use_rawinput = False
        self.prompt = pdb_prompt(channel.rank)
