"""The chaos campaign's scenarios: each drawn from a seed, as a style of running ranks, a fault,
the rank it strikes and the moment it strikes at; the same seed always gives the same
scenario, so that a scenario that broke an invariant is one command to reproduce."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

__all__ = ["FAULTS", "FOUND", "STYLES", "Scenario", "covering_seeds", "draw"]

#: The ways of running ranks the campaign covers, in this kernel's machine.
STYLES = ("cold-fork", "cold-spawn", "warm", "cell", "restarts")

#: The faults, as the worker (or the runner, for ``interrupt`` and ``kernel-killed``) makes them.
FAULTS = (
    "raise",  # the rank raises
    "sigkill",  # the rank is killed
    "sigstop",  # the rank is frozen, not dead
    "stuck-own",  # the rank loops in its own code
    "stuck-collective",  # the rank waits in a receive no other rank sends to
    "interrupt",  # the kernel is interrupted, at start-up, mid-run or teardown
    "breakpoint-and-raise",  # the rank sits at a breakpoint() prompt while another raises
    "print-flood",  # the rank prints a great deal (MB_PRINTED)
    "kernel-killed",  # the kernel itself is killed while the workers run
    "disk-full",  # the checkpoints' file system fills up before the step's save_state
    "killed-in-save",  # the rank is killed inside save_state, its part written, not committed
)

#: Faults that cannot happen in a style: a ``max_restarts`` run restarts after a rank's
#: death or error (its faults end in a resumed run), but has no pool to keep.
NOT_IN: dict[str, tuple[str, ...]] = {}

#: The training steps every scenario's ranks take; a fault strikes at one of them.
STEPS = 6
#: The number of ranks.
RANKS = 2
#: The moments an interrupt can strike: before the workers start, at a step, or as they return.
INTERRUPT_MOMENTS = ("start-up", "mid-run", "teardown")
#: How long the user takes to answer a debugger's prompt: at once, or after the other ranks'
#: failure has reached the kernel.
ANSWER_AFTER_S = (0.0, 0.5, 1.5)


@dataclass(frozen=True)
class Scenario:
    """One scenario: ``style`` of running ranks, ``fault`` on ``rank`` at ``step`` (for an
    interrupt, ``moment`` says when; a debugger's prompt is answered ``answer_after`` seconds
    after it opens), drawn from ``seed``."""

    seed: int
    style: str
    fault: str
    rank: int
    step: int
    moment: str
    answer_after: float = 0.0

    def __str__(self) -> str:
        where = self.moment if self.fault == "interrupt" else f"rank {self.rank}, step {self.step}"
        if self.fault == "breakpoint-and-raise":
            where += f", answered after {self.answer_after} s"
        return f"seed {self.seed}: {self.style} / {self.fault} ({where})"


def draw(
    seed: int, style: str | None = None, fault: str | None = None, answer_after: float | None = None
) -> Scenario:
    """The scenario of ``seed`` (its style, fault and prompt's answer drawn too, unless given)."""
    chance = random.Random(seed)
    chosen_style = chance.choice(STYLES)
    chosen_fault = chance.choice(FAULTS)
    rank = chance.randrange(RANKS)
    step = chance.randrange(1, STEPS)
    moment = chance.choice(INTERRUPT_MOMENTS)
    answer = chance.choice(ANSWER_AFTER_S) if answer_after is None else answer_after
    return Scenario(seed, style or chosen_style, fault or chosen_fault, rank, step, moment, answer)


def covering_seeds() -> list[Scenario]:
    """A fixed set of scenarios covering every style and fault pair once (their seeds fixed:
    the pair's place in the list), each rank and step as its seed draws it."""
    pairs = itertools.product(STYLES, FAULTS)
    return [draw(index, style, fault) for index, (style, fault) in enumerate(pairs)]


#: The scenarios that found a bug, kept as tests: each drawn as it was when it broke.
FOUND = (
    # a pool's rank at a breakpoint() prompt took the interrupt sent for rank 0's failure, and
    # once answered waited in a collective with rank 0 until the timeout
    draw(1005, "cell", "breakpoint-and-raise", answer_after=1.5),
    # the cell ended before the runner saw the step's marker: the kernel, never killed, kept
    # its pool, counted as orphans (the rank now waits for the kill)
    draw(1003, "cell", "kernel-killed"),
    # a cold spawn launch interrupted as its ranks returned waited for the stacks of ranks
    # that had exited, twice over (2 s, bound 2 s; one run in four)
    draw(14, "cold-spawn", "interrupt"),
)
