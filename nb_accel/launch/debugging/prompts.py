"""A line for a rank's debugger, asked in the notebook (its input box) or on the terminal.

While a prompt is open the kernel's prompt clock says so in the folder of each launch that
keeps one (:func:`prompt_clock`), and each follower of the prompts hears when one opens
and closes (:func:`follow_prompts`: a launch across hosts tells its node processes): the ranks
leave the time out of their collective timeout
(:mod:`~nb_accel.worker.debugging.prompt_clock`). The kernel remembers the last prompt each
rank showed (:func:`prompts_since`): a collective timeout that passed while a prompt was open
says the rank was there, not what it did after it was answered."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..._messages import Answer, Prompt, encode_command
from ...worker.debugging.prompt_clock import CLOCK_FILE, PromptClock
from ..failures.whereabouts import Frame
from ..views.stall import note_prompt_time

__all__ = [
    "PromptFollower",
    "ShownPrompt",
    "answer_prompt",
    "ask_line",
    "follow_prompts",
    "prompt_clock",
    "prompts_shown",
    "prompts_since",
    "unfollow_prompts",
]

#: Told ``True`` when a prompt of the kernel opens, ``False`` when it closes.
PromptFollower = Callable[[bool], None]

_followers: list[PromptFollower] = []


@dataclass(frozen=True)
class ShownPrompt:
    """A prompt the kernel showed for a rank: the ``number``-th it showed, its debugger's
    (``debugger``) or ``input()``'s, in the frame ``where`` (file, line, function; ``None``:
    unknown)."""

    number: int
    debugger: bool
    where: tuple[str, int, str] | None

    def status(self) -> str:
        """What the rank is said to have done, for an error: ``was at a pdb prompt, at
        `train` (Cell In[3], line 9)``."""
        kind = "a pdb prompt" if self.debugger else "an input() prompt"
        if self.where is None:
            return f"was at {kind}"
        frame = Frame(*self.where)
        return f"was at {kind}, at `{frame.function}` ({frame.place})"


#: The last prompt the kernel showed for each rank.
_shown: dict[int, ShownPrompt] = {}
#: How many prompts the kernel has shown.
_count: list[int] = [0]


def prompts_shown() -> int:
    """How many prompts the kernel has shown so far: a mark for :func:`prompts_since`."""
    return _count[0]


def prompts_since(mark: int) -> dict[int, ShownPrompt]:
    """The last prompt each rank showed after ``mark`` (what :func:`prompts_shown` said), by
    rank."""
    return {rank: shown for rank, shown in _shown.items() if shown.number > mark}


def _note_shown(event: Prompt) -> None:
    _count[0] += 1
    _shown[event.rank] = ShownPrompt(_count[0], event.debugger, event.where)


def follow_prompts(follower: PromptFollower) -> None:
    """Tell ``follower`` of every prompt that opens and closes, from now on."""
    _followers.append(follower)


def unfollow_prompts(follower: PromptFollower) -> None:
    """Stop telling ``follower``."""
    with contextlib.suppress(ValueError):
        _followers.remove(follower)


@contextlib.contextmanager
def prompt_clock(folder: str) -> Iterator[str]:
    """Keep the prompt clock in a launch's ``folder`` while in the block; its file."""
    clock = PromptClock(os.path.join(folder, CLOCK_FILE))
    follow_prompts(clock.set_open)
    try:
        yield clock.path
    finally:
        unfollow_prompts(clock.set_open)


def _publish(is_open: bool) -> None:
    for follower in list(_followers):
        follower(is_open)


def ask_line(prompt: str) -> str | None:
    """The line typed at ``prompt``; ``None`` when no more can come (end of input, or a
    front end that cannot take input: the rank's debugger then ends)."""
    try:
        return input(prompt)
    except (EOFError, OSError):  # no input (a test's captured stdin, a closed terminal)
        return None
    except Exception as error:  # IPython's StdinNotImplementedError among them
        if type(error).__name__ != "StdinNotImplementedError":
            raise
        print(
            "this front end does not take input (run the cell from Jupyter, or allow stdin): "
            "the debugger ends",
            file=sys.stderr,
        )
        return None


def answer_prompt(event: Prompt, flush: Callable[[], None], send: Callable[[bytes], None]) -> None:
    """Ask for the line ``event`` prompts for, once what the ranks wrote before it is shown
    (``flush``), and send it back to the rank (``send``; a rank gone meanwhile is let be)."""
    flush()
    _note_shown(event)
    asked = time.monotonic()
    _publish(True)
    try:
        line = ask_line(event.text)
    finally:
        took = time.monotonic() - asked
        _publish(False)
    note_prompt_time(took)  # the ranks wait for the user: no stall
    with contextlib.suppress(OSError):
        send(encode_command(Answer(line)))
