"""A line for a rank's debugger, asked in the notebook (its input box) or on the terminal.

While a prompt is open the kernel's prompt clock says so in the folder of each launch that
keeps one (:func:`keep_prompt_clock`): the ranks of that launch leave the time out of their
collective timeout (:mod:`~nb_accel.runtime.debugging.prompt_clock`)."""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
import time
from collections.abc import Callable

from ..._messages import Answer, Prompt
from ...runtime.debugging.prompt_clock import CLOCK_FILE, write_prompt_clock
from ..views.stall import note_prompt_time

__all__ = ["answer_prompt", "ask_line", "drop_prompt_clock", "keep_prompt_clock"]

#: The prompt clocks kept (their files), and the seconds the kernel's prompts were open in all.
_clocks: list[str] = []
_closed_s: list[float] = [0.0]


def keep_prompt_clock(folder: str) -> str:
    """Keep the prompt clock in a launch's ``folder`` from now on; its file."""
    path = os.path.join(folder, CLOCK_FILE)
    write_prompt_clock(path, _closed_s[0], None)
    _clocks.append(path)
    return path


def drop_prompt_clock(path: str) -> None:
    """Stop keeping the clock in ``path`` (its launch has ended)."""
    with contextlib.suppress(ValueError):
        _clocks.remove(path)


def _publish(open_since: float | None) -> None:
    for path in _clocks:
        write_prompt_clock(path, _closed_s[0], open_since)


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
    asked = time.monotonic()
    _publish(asked)
    try:
        line = ask_line(event.text)
    finally:
        took = time.monotonic() - asked
        _closed_s[0] += took
        _publish(None)
    note_prompt_time(took)  # the ranks wait for the user: no stall
    with contextlib.suppress(OSError):
        send(pickle.dumps(Answer(line)))
