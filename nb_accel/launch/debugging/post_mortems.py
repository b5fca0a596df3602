"""The post-mortem the last failed command offers: which ranks keep the frames where they
raised, and how to open the debugger on one of them.

A ``%%distributed`` cell or warm launch that fails offers one (:func:`offer_post_mortem`);
``%debug`` right after it (the shell's last error is that failure) opens the root cause's
rank, ``%distributed debug RANK`` another failed rank. Only the last failure's is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ...worker.debugging.breakpoints import DebuggerQuit
from ..failures.failure_log import FailureLog
from ..failures.verdict import judge

__all__ = [
    "PostMortem",
    "raising_ranks",
    "forget_post_mortem",
    "in_ipython",
    "last_post_mortem",
    "offer_post_mortem",
    "post_mortem_for",
]


@dataclass(frozen=True)
class PostMortem:
    """A failure whose ranks keep their frames.

    Attributes:
        error: the exception the kernel raised for it.
        ranks: the ranks that raised and keep their frames, the root cause's first.
        opener: opens the debugger on one of them (returns when the user quits it).
        owner: what keeps the ranks (a pool): its end makes the post-mortem go.
    """

    error: BaseException
    ranks: tuple[int, ...]
    opener: Callable[[int], None]
    owner: object

    def inspect_rank(self, rank: int | None = None) -> None:
        """Open the debugger on ``rank`` (default: the root cause's)."""
        inspected = self.ranks[0] if rank is None else rank
        if inspected not in self.ranks:
            raise ValueError(
                f"rank {inspected} did not raise in the last failure; ranks "
                f"{', '.join(map(str, self.ranks))} did: %distributed debug RANK with one of them"
            )
        self.opener(inspected)


#: The last failure's post-mortem, under ``"last"`` (none: nothing to inspect).
_offered: dict[str, PostMortem] = {}


#: The type name of ``q`` typed in a rank's debugger: nothing to inspect after it.
_QUIT = f"{DebuggerQuit.__module__}.{DebuggerQuit.__qualname__}"


def raising_ranks(failures: FailureLog) -> list[int]:
    """The ranks that raised an exception of their own (not died), the root cause's first;
    none when the root cause is ``q`` typed in a rank's debugger (the user ended the run)."""
    verdict = judge(failures.records, failures.timeout_ranks)
    if any(record.type_name == _QUIT for record in verdict.root):
        return []
    raised = [r.rank for r in failures.records if not r.signal_name and r.type_name != "exit"]
    root = [rank for rank in verdict.root_ranks if rank in raised]
    return list(dict.fromkeys([*root, *sorted(raised)]))


def in_ipython() -> bool:
    """Whether this process is an IPython shell (a notebook's kernel, among others)."""
    import sys

    ipython = sys.modules.get("IPython")
    return ipython is not None and ipython.get_ipython() is not None


def offer_post_mortem(
    error: BaseException, ranks: Sequence[int], opener: Callable[[int], None], owner: object
) -> None:
    """Make ``error``'s ranks inspectable (the previous failure's are let go); in IPython,
    the error's last note says how."""
    if not ranks:
        return
    _offered["last"] = PostMortem(error, tuple(ranks), opener, owner)
    if in_ipython() and hasattr(error, "add_note"):
        others = " (%distributed debug RANK for another)" if len(ranks) > 1 else ""
        error.add_note(f"%debug opens the debugger on rank {ranks[0]}, where it raised{others}.")


def post_mortem_for(error: object) -> PostMortem | None:
    """The post-mortem ``error`` offers, if it is the last failure's exception."""
    last = _offered.get("last")
    return last if last is not None and last.error is error else None


def last_post_mortem() -> PostMortem | None:
    """The last failure's post-mortem, if any."""
    return _offered.get("last")


def forget_post_mortem(owner: object) -> None:
    """Let the post-mortem go if ``owner`` keeps its ranks (it is stopping)."""
    last = _offered.get("last")
    if last is not None and last.owner is owner:
        del _offered["last"]
