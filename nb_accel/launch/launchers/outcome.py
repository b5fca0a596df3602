"""A launch's outcome: the ranks' results in rank order, or the exception the kernel raises.

The exception is the root cause's (a worker's own exception, its death, a collective timeout),
with the ranks it brought down named as stopped by it and what the other ranks did (``rank 1
had already returned``, ``was at a pdb prompt``) where it explains the failure; the one driver
(:mod:`~nb_accel.launch.driver.driver`) builds it here for every way of running ranks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ...errors import LaunchError, is_peer_loss
from ...worker.transfer.pickling import loads
from ..failures.failure_log import FailureLog
from ..failures.whereabouts import RankStack, stacks_note

__all__ = ["CAME_LATE", "FROZEN", "RETURNED", "RETURNED_LATER", "failure_outcome", "load_result"]

#: What a rank that returned before the failure is said to have done.
RETURNED = "had already returned"
#: What a rank that was still running when the failure came, and returned after it, did (in
#: a timeout: it was late, not absent).
RETURNED_LATER = "was still running then; it returned later"
#: What a rank whose connections were lost after the others timed out is said to have done.
CAME_LATE = "its collective failed when the waiting ranks gave up"
#: What a rank whose process was stopped (SIGSTOP, Ctrl-Z, a debugger holding it) did.
FROZEN = "was frozen: its process was stopped (SIGSTOP, Ctrl-Z or a debugger holding it)"


def load_result(rank: int, data: bytes) -> Any:
    """Rank ``rank``'s return value, or a :class:`LaunchError` saying it could not be loaded.
    Its big tensors and arrays are mapped from the shared-memory segment the rank wrote (and
    the segment's file removed: the mapping is the kernel's now)."""
    try:
        return loads(data, consume=True)
    except Exception as exc:
        raise LaunchError(
            f"rank {rank}'s return value could not be loaded in the kernel ({exc!r}); "
            "return plain data (numbers, tensors, lists, dicts) instead"
        ) from exc


def failure_outcome(
    failures: FailureLog,
    world_size: int,
    timeout_s: float,
    finished: Iterable[int],
    unfinished: Iterable[int] = (),
    finished_as: str = RETURNED,
    returned_later: Iterable[int] = (),
    where: Mapping[int, RankStack] | None = None,
    kept: bool = False,
    prompts: Mapping[int, str] | None = None,
    frozen: Iterable[int] = (),
    out_of_reach: Mapping[int, str] | None = None,
    elsewhere: Mapping[int, str] | None = None,
) -> BaseException:
    """The exception for ``failures`` (there is at least one), the launch being over.

    Args:
        failures: the launch's failures; the view is brought to the final verdict.
        world_size: ranks in the launch.
        timeout_s: the launch's collective timeout, quoted in timeout errors.
        finished: ranks that finished their work (said to have done ``finished_as``).
        unfinished: ranks that neither finished nor failed (the launcher stopped them): shown
            stopped by the root cause.
        finished_as: what the finished ranks are said to have done.
        returned_later: finished ranks that were still running when the first failure came:
            said to have returned later (:data:`RETURNED_LATER`), not before it.
        where: where unfinished ranks were (their stacks), by rank: each one's summary is
            said with its status, and every thread's frames in a note.
        kept: whether the ranks outlive the failure (a pool's, a warm launch's): those it
            stopped were interrupted and kept their variables.
        prompts: the ranks that showed a prompt during the command, each with the last one it
            showed (``was at a pdb prompt, at ...``): what each that did not fail on its own is
            said to have done when a rank's timeout passed while a prompt was open (what it did
            once answered, returning or coming late, is not what the others waited for).
        frozen: unfinished ranks whose process was stopped (SIGSTOP, Ctrl-Z): said so.
        out_of_reach: unfinished ranks the kernel lost contact with (their host's connection
            ended), each with what is known of it: said instead of where they were.
        elsewhere: the ranks this kernel does not run (another node's), each with where it
            is: said of those without a failure of their own.
    """
    unfinished = list(unfinished)
    failures.settle(unfinished)
    status = dict.fromkeys(finished, finished_as)
    status.update(dict.fromkeys(returned_later, RETURNED_LATER))
    for rank, stack in (where or {}).items():
        status[rank] = f"was still running, {stack.summary()}"
    for rank in frozen:
        status[rank] = FROZEN
    status.update(out_of_reach or {})
    for record in failures.records:  # a lost peer after a timeout: the timed-out rank let go
        late = is_peer_loss(record.message)
        status.setdefault(record.rank, CAME_LATE if late else f"failed with {record.first_line}")
    for rank, said in (elsewhere or {}).items():
        status.setdefault(rank, said)
    if prompts and any(record.at_prompt for record in failures.records):
        own = {record.rank for record in failures.records if not is_peer_loss(record.message)}
        status.update((rank, said) for rank, said in prompts.items() if rank not in own)
    error = failures.exception(world_size, status, timeout_s, kept)
    if (note := stacks_note(where or {})) and hasattr(error, "add_note"):
        error.add_note(note)
    return error
