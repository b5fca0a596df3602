"""A line for a rank's debugger, asked in the notebook (its input box) or on the terminal."""

from __future__ import annotations

import sys

__all__ = ["ask_line"]


def ask_line(prompt: str) -> str | None:
    """The line typed at ``prompt``; ``None`` when no more can come (end of input, or a
    front end that cannot take input: the rank's debugger then ends)."""
    try:
        return input(prompt)
    except EOFError:
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
