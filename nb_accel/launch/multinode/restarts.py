"""The restarts of a launch run by torch's elastic agent, as the kernel tells them.

With ``max_restarts`` the agent of every node restarts the whole worker group after a failure
(torch elastic's meaning). :class:`Restarts` turns each restart into one line for the launch
view, naming the failure that caused it (``"restart 1 of 2 after rank 1 was killed by
SIGKILL"``), and, when the launch fails for good, into a note on the exception: the earlier
attempts' causes, or, when every attempt ended with the same error, that it repeated (the
error itself is reported once). :func:`worker_deaths` makes records for the workers an agent
saw die without reporting, on one node or across hosts.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable

from ...errors import WorkerFailure
from ...worker.process.node_worker import global_rank
from ..failures.failure_log import FailureLog
from ..failures.verdict import died_failure, judge

__all__ = ["STOPPED_CODES", "Restarts", "with_restarts", "worker_deaths"]

#: Exit codes of workers their agent stopped (SIGTERM) after another failure: not causes.
STOPPED_CODES = (-signal.SIGTERM, 128 + signal.SIGTERM)

#: What tells two attempts' failures apart (see :func:`_key`).
_Cause = tuple[str, str]


def worker_deaths(
    node_rank: int,
    died: Iterable[tuple[int, int, int]],
    per_node: int,
    reported: set[int],
    stderr_tail: dict[int, str],
    host: str | None = None,
    oom_killed: bool | None = None,
) -> list[WorkerFailure]:
    """Records for node ``node_rank``'s workers that ``died`` without reporting, given as the
    agent has them (``(local rank, pid, exit code)``): not those in ``reported``, nor those
    their agent stopped after another failure; each judged with the end of its stderr (and
    ``oom_killed``: whether the node's out-of-memory killer killed meanwhile, if known)."""
    found = []
    for local_rank, pid, exitcode in died:
        rank = global_rank(node_rank, local_rank, per_node)
        if rank in reported or exitcode in STOPPED_CODES:
            continue
        last_words = stderr_tail.get(rank, "")
        found.append(died_failure(rank, pid, exitcode, last_words, host, oom_killed))
    return found


def _root(log: FailureLog) -> WorkerFailure | None:
    """The failure an attempt ended with (its root cause), if any."""
    if not log.records:
        return None
    verdict = judge(log.records, log.timeout_ranks)
    return (verdict.root or log.records)[0]


def _key(record: WorkerFailure) -> _Cause:
    """What makes two attempts' failures the same: the error's kind and text (a death: its
    signal or exit code, not its pid), whichever rank's report came first."""
    if record.type_name == "signal":
        return ("signal", str(record.signal_name))
    if record.type_name == "exit":
        return ("exit", str(record.exitcode))
    return (record.type_name, record.message)


def describe_cause(record: WorkerFailure) -> str:
    """A failure in a few words: ``"rank 1 was killed by SIGKILL"``, ``"rank 0 raised
    ValueError: bad batch"``."""
    if record.type_name == "signal":
        return f"rank {record.rank} was killed by {record.signal_name}"
    if record.type_name == "exit":
        return f"rank {record.rank} exited with code {record.exitcode}"
    return f"rank {record.rank} raised {record.first_line}"


class Restarts:
    """The restarts of one launch (``max_restarts``: how many the agents may make).

    Attributes:
        causes: each earlier attempt's root cause (``None``: it ended with no failure known,
            as when another node's agent restarted the group), in order.
    """

    def __init__(self, max_restarts: int) -> None:
        self.max_restarts = max_restarts
        self.causes: list[WorkerFailure | None] = []

    def line(self, attempt: int, ended: FailureLog) -> str:
        """The line that shows restart ``attempt`` (1 for the first), the attempt before it
        having ended with the failures in ``ended``; notes its cause."""
        cause = _root(ended)
        same = (
            cause is not None
            and bool(self.causes)
            and self.causes[-1] is not None
            and _key(self.causes[-1]) == _key(cause)
        )
        self.causes.append(cause)
        head = f"restart {attempt} of {self.max_restarts}"
        if cause is None:
            return head
        if same:
            return f"{head} after the same failure again ({_brief(cause)})"
        return f"{head} after {describe_cause(cause)}"

    def note(self, final: FailureLog) -> str | None:
        """What a failed launch's exception says of the attempts before the last (``final``:
        its failures); ``None`` when there were none."""
        if not self.causes:
            return None
        attempts = len(self.causes) + 1
        last = _root(final)
        known = [cause for cause in self.causes if cause is not None]
        if last is not None and len(known) == len(self.causes):
            if all(_key(cause) == _key(last) for cause in known):
                return (
                    f"This error ended every one of the {attempts} attempts (the first run and "
                    f"{len(self.causes)} restart{'s' if len(self.causes) > 1 else ''}, "
                    f"max_restarts={self.max_restarts}): restarting does not get past it; "
                    "fix its cause, then launch again."
                )
        earlier = "; ".join(
            f"attempt {number} ended when {describe_cause(cause)}"
            if cause is not None
            else f"attempt {number} was restarted with another node's workers"
            for number, cause in enumerate(self.causes, start=1)
        )
        count = len(self.causes)
        return (
            f"The worker group was restarted {count} time{'s' if count > 1 else ''} "
            f"(max_restarts={self.max_restarts}) before this failure: {earlier}."
        )


def with_restarts(outcome: object, restarts: Restarts, final: FailureLog) -> None:
    """Add to a failed launch's exception (``outcome``) what :meth:`Restarts.note` says of the
    attempts before ``final``; results are left as they are."""
    note = restarts.note(final) if isinstance(outcome, BaseException) else None
    if note is not None and hasattr(outcome, "add_note"):  # Python 3.11+
        outcome.add_note(note)


def _brief(record: WorkerFailure) -> str:
    """``"rank 1, SIGKILL"``, ``"rank 0, ValueError"``."""
    if record.type_name == "signal":
        return f"rank {record.rank}, {record.signal_name}"
    if record.type_name == "exit":
        return f"rank {record.rank}, exit code {record.exitcode}"
    return f"rank {record.rank}, {record.short_type}"
