"""What a pool says once a rank failed or died: the group made anew, the pool stopped, a dead
rank replaced, and the variables the new process lacks that the other ranks hold."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..failures.verdict import rank_list

__all__ = [
    "NAMES_CODE",
    "REBUILT_NOTE",
    "STOPPED_NOTE",
    "lacking_names",
    "lacking_note",
    "replaced_note",
]

#: Said when the workers rebuilt their process group (one line: what the user must do).
REBUILT_NOTE = (
    "The process group was remade after the previous failure or interrupt: models "
    "prepared before it must be prepared again (accelerator.prepare)"
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


#: The code a pool runs on its ranks to hear the names of the user's variables each holds
#: (:func:`~nb_accel.worker.process.pool_worker.user_names`), as its last expression's value.
NAMES_CODE = (
    "__import__('nb_accel.worker.process.pool_worker', fromlist=['user_names'])"
    ".user_names(globals())"
)

#: How many names of one group :func:`lacking_note` writes out before it counts the rest.
_SHOWN_NAMES = 8


def lacking_names(held: Mapping[int, Sequence[str]], new: Sequence[int]) -> dict[str, list[int]]:
    """The names the kept ranks hold (``held``: each rank's names, the ``new`` ranks' too) that
    no new rank does, each with the kept ranks that hold it; in rank order, then each rank's
    own order."""
    fresh = {name for rank in new for name in held.get(rank, ())}
    lacking: dict[str, list[int]] = {}
    for rank in sorted(held):
        if rank in new:
            continue
        for name in held[rank]:
            if name not in fresh:
                lacking.setdefault(name, []).append(rank)
    return lacking


def _names(names: Sequence[str]) -> str:
    """``names`` quoted, the first :data:`_SHOWN_NAMES` of them, the rest counted."""
    shown = ", ".join(f"`{name}`" for name in names[:_SHOWN_NAMES])
    more = len(names) - _SHOWN_NAMES
    return f"{shown} and {more} more" if more > 0 else shown


def lacking_note(new: Sequence[int], lacking: Mapping[str, Sequence[int]]) -> str:
    """What a pool's error says once its ``new`` ranks (started in place of dead ones, with a
    fresh namespace) run beside ranks that kept theirs: the names each of those holds that the
    new ranks lack (``lacking``: each name with the ranks that hold it)."""
    which = rank_list(new)
    one = len(new) == 1
    if not lacking:
        return (
            f"{which[0].upper()}{which[1:]} {'is' if one else 'are'} new; the other ranks hold "
            f"no variables {'it lacks' if one else 'they lack'}."
        )
    groups: dict[tuple[int, ...], list[str]] = {}
    for name, ranks in lacking.items():
        groups.setdefault(tuple(ranks), []).append(name)
    held = " and ".join(
        f"{_names(names)} that {rank_list(ranks)} {'holds' if len(ranks) == 1 else 'hold'}"
        for ranks, names in groups.items()
    )
    return (
        f"{which[0].upper()}{which[1:]} {'is new: it lacks' if one else 'are new: they lack'} "
        f"{held}; run the cells that define {'it' if len(lacking) == 1 else 'them'} again."
    )
