"""What a pool says once a rank failed or died: the group made anew, the pool stopped, a dead
rank replaced."""

from __future__ import annotations

from ..failures.verdict import rank_list

__all__ = ["REBUILT_NOTE", "STOPPED_NOTE", "replaced_note"]

#: Said when the workers rebuilt their process group (one line: what the user must do).
REBUILT_NOTE = (
    "The process group was rebuilt after the failed or interrupted cell: prepare models "
    "wrapped before it again (accelerator.prepare)"
)

#: The note on the error of a rank whose death stopped the pool.
STOPPED_NOTE = (
    "The pool is stopped: %distributed restart starts it again, and the next launch with "
    "reuse_workers=True starts fresh workers."
)


def replaced_note(dead: list[int], pids: list[int], took_s: float, ran: bool) -> str:
    """What a pool's error says once its ``dead`` ranks were replaced (by ``pids``, in
    ``took_s`` seconds; ``ran``: they died during the command, else before it)."""
    which = rank_list(dead)
    own = "its" if len(dead) == 1 else "their"
    new = ", ".join(map(str, pids))
    text = (
        f"{which} died and {'was' if len(dead) == 1 else 'were'} replaced by a new process "
        f"(pid {new}); the process group was made anew in {took_s:.2f} s. The variables "
        f"{which} held are gone (the other ranks kept theirs) and {own} residents are built "
        "again when first used: run the cells that set them again."
    )
    text = text[0].upper() + text[1:]
    if not ran:
        text += " This cell did not run: run it again."
    return text
