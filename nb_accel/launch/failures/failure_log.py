"""A launch's failures as they arrive, with the launch view kept in step with the verdict.

The view shows the root cause as a failure and the ranks it brought down (a lost connection, a
timed-out collective) as stopped by it. Failures arrive in any order (a rank's lost connection
can reach the kernel before the exception of the rank that went away), so an error that looks
like a consequence is shown only once something else explains it, or when the launch is over
(:meth:`FailureLog.settle`): the view never flashes a backend's internal text for a rank that
only stopped because another failed. Ranks that ended without an error of their own (stopped
by the launcher once the cause was known, or relaying another node's failure) are shown
stopped by the root cause too.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..._messages import Failure
from ...errors import WorkerFailure
from ..views.view import LaunchView
from .verdict import (
    build_exception,
    failure_from_event,
    is_watchdog_timeout,
    judge,
    looks_like_consequence,
)

__all__ = ["COLLECT_WINDOW_S", "EXPLAIN_WINDOW_S", "FailureLog"]

#: After the first failure, how long to keep listening for the other ranks' reports (seconds).
COLLECT_WINDOW_S = 0.05
#: The same while every failure so far looks like a consequence (a lost connection, a timed-out
#: collective): the failure that caused it may still be on its way (seconds).
EXPLAIN_WINDOW_S = 1.0


class FailureLog:
    """The failure records of one launch, in arrival order.

    Args:
        view: told ``failed`` for the root cause and other independent failures, ``stopped``
            for the knock-on failures; ``None`` for none.
    """

    def __init__(self, view: LaunchView | None = None) -> None:
        self.records: list[WorkerFailure] = []
        #: Ranks whose failure was a collective timeout.
        self.timeout_ranks: set[int] = set()
        #: The launch view kept in step (may be replaced between commands of a pool).
        self.view = view
        #: Ranks that ended because of another rank's failure, without an error of their own.
        self.stopped_ranks: set[int] = set()
        self._shown: dict[int, tuple[str, str]] = {}

    def __bool__(self) -> bool:
        return bool(self.records)

    @property
    def ranks(self) -> set[int]:
        """The ranks that failed, whatever the reason."""
        return {record.rank for record in self.records}

    @property
    def has_cause(self) -> bool:
        """Whether a failure that can be the root cause has arrived (an exception that is no
        lost connection or collective timeout, or a worker's death): until then the cause may
        still be on its way."""
        return any(
            record.type_name in ("signal", "exit")
            or not looks_like_consequence(record, record.rank in self.timeout_ranks)
            for record in self.records
        )

    @property
    def collect_window(self) -> float:
        """How long after the first failure to keep listening for the other ranks' reports
        before acting on them (:data:`COLLECT_WINDOW_S`, or :data:`EXPLAIN_WINDOW_S` until a
        failure that can be the cause has arrived)."""
        return COLLECT_WINDOW_S if self.has_cause else EXPLAIN_WINDOW_S

    def add_event(self, event: Failure) -> WorkerFailure:
        """Record a worker's :class:`Failure` event; returns its record."""
        record, is_timeout = failure_from_event(event)
        if is_timeout:
            self.timeout_ranks.add(record.rank)
        self.add(record)
        return record

    def add(self, record: WorkerFailure) -> None:
        """Record a failure and bring the view up to date (a worker that NCCL's watchdog
        aborted because a collective timed out counts as a collective timeout). The end of a
        rank that was stopped by another's failure (it reported that failure, or the launch
        stopped it) is how its stop looks, not a failure of its own: it is not recorded."""
        if record.type_name in ("signal", "exit") and record.rank in self.stopped_ranks:
            return
        if is_watchdog_timeout(record):
            self.timeout_ranks.add(record.rank)
        self.records.append(record)
        self._show(final=False)

    def add_stopped(self, rank: int) -> None:
        """Record that ``rank`` ended because of another rank's failure (it reported that
        failure, not an error of its own)."""
        self.stopped_ranks.add(rank)
        self._show(final=False)

    def settle(self, unfinished: Iterable[int] = ()) -> None:
        """The launch is over: show every failure as the final verdict has it, and the
        ``unfinished`` ranks (neither returned nor failed: the launcher stopped them) as
        stopped by the root cause."""
        if self.records:
            failed = self.ranks
            self.stopped_ranks.update(rank for rank in unfinished if rank not in failed)
            self._show(final=True)

    def _show(self, final: bool) -> None:
        view = self.view
        if view is None or not self.records:
            return
        verdict = judge(self.records, self.timeout_ranks)
        wanted: dict[int, tuple[str, str]] = {}
        failed = self.ranks
        for rank in sorted(self.stopped_ranks - failed):
            wanted[rank] = ("stopped", verdict.stop_reason())
        for record in verdict.consequences:
            wanted[record.rank] = ("stopped", verdict.stop_reason())
        for record in [*verdict.root, *(f for group in verdict.others for f in group)]:
            unexplained = looks_like_consequence(record, record.rank in self.timeout_ranks)
            if final or not unexplained:
                wanted.setdefault(record.rank, ("failed", record.first_line))
        for rank, shown in wanted.items():
            if self._shown.get(rank) != shown:
                self._shown[rank] = shown
                (view.stopped if shown[0] == "stopped" else view.failed)(rank, shown[1])

    def exception(
        self, world_size: int, status: dict[int, str], timeout_s: float, kept: bool = False
    ) -> BaseException:
        """The exception the kernel raises for these failures (see
        :func:`~nb_accel.launch.failures.verdict.build_exception`; ``kept``: the ranks outlive
        the failure)."""
        stopped = self.stopped_ranks - self.ranks
        return build_exception(
            self.records, self.timeout_ranks, world_size, status, timeout_s, stopped, kept
        )
