"""The ranks still running a pool's command once another rank's command failed or its process
died: each is freed as a cold launch would stop it, but keeps its namespace.

A rank waiting inside torch (a collective with the failed rank, most likely) is freed by having
the failed ranks release their process group: the collective then fails at once. A rank still in
its own code (a long loop, a ``time.sleep``, code before its next collective) is interrupted:
``KeyboardInterrupt`` ends the command there, the variables stay. Where it was is taken first,
for the error to say (``Rank 1 did not arrive (was still running, at `f` (...))``); its
interrupt is how it stopped, not a failure of its own. A rank that does not stop within
the pool's grace for an interrupt (its code catches ``KeyboardInterrupt``, or it is stuck
in native code) has the pool stopped.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..._messages import CellDone, Failure, Interrupt, encode_command
from ..failures.whereabouts import RankStack, in_own_code, stacks_note, where_lines
from .interface import PoolRanks

__all__ = [
    "RECHECK_S",
    "LateRanks",
    "free_late",
    "recheck_late",
    "send_interrupts",
    "stuck_interrupt",
    "was_interrupted",
]

#: While the user's interrupt is on its way to the ranks, how often to look again whether one
#: waits inside torch, to be released (seconds).
RECHECK_S = 0.2


@dataclass
class LateRanks:
    """What the pool did with the ranks still running the current command after a failure.

    Attributes:
        interrupted: the ranks interrupted because of the failure.
        stacks: where each interrupted rank was, taken before its interrupt.
        deadline: when the interrupted ranks must have stopped (``time.monotonic()``); ``None``
            until the late ranks are freed.
        window_ends: when the failures so far have had their window to arrive
            (:meth:`~.interface.PoolRanks.collect_window`); ``None`` before the first.
        release: has the failed ranks let go of their process group, while they still hold
            it (``None`` once done): an interrupted rank may reach a collective before its
            interrupt does (or ignore it at a debugger's prompt), and waits there until released.
        recheck_at: when to look again whether an interrupted rank now waits inside torch.
    """

    interrupted: list[int] = field(default_factory=list)
    stacks: dict[int, RankStack] = field(default_factory=dict)
    deadline: float | None = None
    window_ends: float | None = None
    release: Callable[[], None] | None = None
    recheck_at: float | None = None

    def stuck(self, done: Mapping[int, CellDone], now: float) -> list[int]:
        """The interrupted ranks that have not stopped by the deadline (none before it)."""
        if self.deadline is None or now < self.deadline:
            return []
        return [rank for rank in self.interrupted if rank not in done]

    def wake(self, done: Mapping[int, CellDone], now: float) -> float | None:
        """Seconds until this has something to do: the window's end, or the interrupted
        ranks' deadline; ``None``: nothing."""
        if self.deadline is None:
            return None if self.window_ends is None else max(self.window_ends - now, 0.0)
        if any(rank not in done for rank in self.interrupted):
            due = self.deadline if self.recheck_at is None else min(self.deadline, self.recheck_at)
            return max(due - now, 0.0)
        return None

    def stopped_by_failure(self, reply: CellDone) -> bool:
        """Whether ``reply`` is that of a rank this interrupted, ending with the interrupt
        (it stopped because another rank failed; an error of its own still counts)."""
        return reply.rank in self.interrupted and was_interrupted(reply.failure)


def was_interrupted(failure: Failure | None) -> bool:
    """Whether ``failure`` is a ``KeyboardInterrupt``."""
    return failure is not None and failure.type_name == "builtins.KeyboardInterrupt"


def free_late(
    group: PoolRanks,
    running: list[int],
    where: Callable[[list[int], bool], Mapping[int, RankStack]],
    nccl: bool,
    release: Callable[[], None],
    grace: float,
    interrupt: bool = True,
) -> LateRanks:
    """Free the ``running`` ranks after another rank's failure: ``release`` (the failed ranks
    let go of their process group) for those waiting inside torch, with their own collectives
    aborted on ``nccl``; with ``interrupt``, an interrupt for those in their own code (where
    each was taken first, ``where(ranks, collectives)``), given ``grace`` seconds to stop.
    Without ``interrupt`` (the user's is on its way to them) and none in torch yet, they are
    looked at again :data:`RECHECK_S` later. A frozen rank (its process stopped) can take no
    interrupt: it is ended at once (kept ranks replace it)."""
    frozen = group.frozen(running)
    if frozen:
        group.end_frozen(frozen)
        running = [rank for rank in running if rank not in frozen]
    stacks = dict(where(running, nccl)) if running else {}
    own = in_own_code(running, stacks)
    in_torch = [rank for rank in running if rank not in own]
    if in_torch:
        release()
        waiting = [r for r in in_torch if (c := stacks[r].collective) and c.waiting]
        if waiting:
            group.abort_collectives(waiting)
    elif not interrupt:
        return LateRanks(window_ends=time.monotonic() + RECHECK_S)
    if not interrupt:
        own = []
    send_interrupts(group, own)
    kept = {rank: stacks[rank] for rank in own if rank in stacks}
    now, held = time.monotonic(), None if in_torch else release
    again = now + RECHECK_S if own and held is not None else None
    return LateRanks(own, kept, now + grace, release=held, recheck_at=again)


def recheck_late(
    late: LateRanks,
    group: PoolRanks,
    where: Callable[[list[int], bool], Mapping[int, RankStack]],
    nccl: bool,
    now: float,
) -> None:
    """Once :data:`RECHECK_S` has passed, look again where the interrupted ranks still running
    are: one that now waits inside torch (its interrupt came too late, or a debugger's prompt
    took it) has the failed ranks release their process group, which frees it at once."""
    if late.release is None or late.recheck_at is None or now < late.recheck_at:
        return
    running = [r for r in late.interrupted if r not in group.done and group.alive(r)]
    if not running:
        late.recheck_at = None
        return
    stacks = where(running, nccl)
    own = in_own_code(running, stacks)
    in_torch = [rank for rank in running if rank not in own]
    if not in_torch:
        late.recheck_at = time.monotonic() + RECHECK_S
        return
    release, late.release, late.recheck_at = late.release, None, None
    release()
    waiting = [r for r in in_torch if (c := stacks[r].collective) and c.waiting]
    if waiting:
        group.abort_collectives(waiting)


def send_interrupts(group: PoolRanks, ranks: list[int]) -> None:
    """Interrupt each of ``ranks`` still running the current command: the
    :class:`~nb_accel._messages.Interrupt` message first (the worker then knows the SIGINT
    that follows is for this command), then the signal."""
    for rank in ranks:
        if rank not in group.done and group.alive(rank):
            with contextlib.suppress(OSError):  # a worker that died is noticed by the wait
                group.send(rank, encode_command(Interrupt(group.cell)))
                group.interrupt(rank)


def stuck_interrupt(
    stuck: list[int], stacks: Mapping[int, RankStack], grace: float, after: str
) -> KeyboardInterrupt:
    """The ``KeyboardInterrupt`` that says ``stuck`` did not stop within ``grace`` seconds of
    an interrupt (sent ``after`` something) and the pool was stopped, with where each is."""
    places = "".join("\n" + line for line in where_lines(stacks, "is"))
    interrupt = KeyboardInterrupt(
        f"rank(s) {stuck} did not stop within {grace:.0f} s of the interrupt {after} "
        "(stuck in a collective, or catching KeyboardInterrupt?); the pool was stopped: "
        f"%distributed restart starts it again{places}"
    )
    if (note := stacks_note(stacks)) and hasattr(interrupt, "add_note"):
        interrupt.add_note(note)
    return interrupt
