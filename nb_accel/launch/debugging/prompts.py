"""A line for a rank's debugger, asked in the notebook (its input box) or on the terminal."""

from __future__ import annotations

import contextlib
import pickle
import sys
import time
from collections.abc import Callable

from ..._messages import Answer, Prompt
from ..views.stall import note_prompt_time

__all__ = ["answer_prompt", "ask_line"]


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
    line = ask_line(event.text)
    note_prompt_time(time.monotonic() - asked)  # the ranks wait for the user: no stall
    with contextlib.suppress(OSError):
        send(pickle.dumps(Answer(line)))
