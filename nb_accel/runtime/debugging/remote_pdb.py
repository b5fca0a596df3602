"""pdb in a worker, typed at from the notebook.

:class:`ChannelPdb` is the standard library's ``pdb.Pdb`` with one difference: it reads and
writes through :class:`PromptStream`, which sends what pdb writes to the kernel as the rank's
output and, when pdb reads a line, sends the prompt (:class:`~nb_accel._messages.Prompt`) and
waits for the kernel's :class:`~nb_accel._messages.Answer`. Every pdb command works as in a
terminal; the prompt names the rank.
"""

from __future__ import annotations

import pdb
import pickle

from ..._messages import Answer, Output, Prompt
from ..reporting.channel import EventChannel

__all__ = ["ChannelPdb", "PromptStream", "pdb_prompt"]


def pdb_prompt(rank: int) -> str:
    """The debugger's prompt on ``rank``."""
    return f"(Pdb rank {rank}) "


class PromptStream:
    """pdb's stdin and stdout over the rank's event channel (a text stream pdb reads lines
    from and writes to).

    Args:
        channel: the rank's event channel.
    """

    def __init__(self, channel: EventChannel) -> None:
        self._channel = channel
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
            self._channel.send(Output(self._channel.rank, "stdout", text))

    def flush(self) -> None:
        """Nothing to do: lines go out as they end, the prompt with the next read."""

    def readline(self) -> str:
        """The next line the notebook's user types (``""`` when there is none: pdb's end of
        input, which ends the debugger)."""
        prompt, self._pending = self._pending, ""
        self._channel.send(Prompt(self._channel.rank, prompt))
        answer = pickle.loads(self._channel.receive())
        if not isinstance(answer, Answer) or answer.text is None:
            return ""  # the kernel has no line for it: the end of input
        return answer.text + "\n"

    def isatty(self) -> bool:
        """Not a terminal."""
        return False


class ChannelPdb(pdb.Pdb):
    """pdb whose prompts are answered in the notebook (see the module).

    Args:
        channel: the rank's event channel.
    """

    def __init__(self, channel: EventChannel) -> None:
        stream = PromptStream(channel)
        super().__init__(stdin=stream, stdout=stream, nosigint=True)  # type: ignore[arg-type]
        self.use_rawinput = False
        self.prompt = pdb_prompt(channel.rank)
