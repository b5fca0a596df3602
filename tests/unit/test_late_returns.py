"""A rank that was still running when another rank's failure came, and returned only after it,
is said to have returned later, not to have "already returned" (which says it never came to the
collective the others waited in): a rank busy printing 100 MB past the timeout, then returning,
was late, not absent. The driver tells the two apart by what had returned when it saw the
first failure, and, where the workers stamped their replies, by those stamps: the ranks of a
launch on hosts reply on different channels, and the one read first may have been sent last.
The ranks' replies arrive as the script of a launch's group says."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from nb_accel._messages import CellDone, Failure
from nb_accel.errors import CollectiveTimeoutError
from nb_accel.launch.driver.driver import RankDriver
from nb_accel.launch.failures.whereabouts import RankStack
from nb_accel.launch.launchers.dispatch import EventDispatcher
from nb_accel.launch.launchers.outcome import RETURNED, RETURNED_LATER
from nb_accel.launch.pool_ranks.interface import PoolRanks, RankStatus
from nb_accel.launch.views.view import LaunchView, NullView
from nb_accel.worker.transfer.pickling import Pickled

pytestmark = pytest.mark.timeout(60)

TIMEOUT = Failure(
    0,
    "builtins.TimeoutError",
    "Timed out after 2 s waiting in all_reduce #2 (the launch's collective timeout)",
    "",
    None,
    is_timeout=True,
    collective="all_reduce #2",
)


class ScriptedRanks(PoolRanks):
    """A launch's two ranks whose replies arrive as ``script`` says: each look at them
    (:meth:`watch`) takes the next step's replies."""

    keeps = False
    finished_as = RETURNED

    def __init__(self, script: list[list[CellDone]]) -> None:
        self.events = EventDispatcher(lambda output: None, None)
        self.cell = 0
        self.done: dict[int, CellDone] = {}
        self._steps: Iterator[list[CellDone]] = iter(script)

    def watch(self, view: LaunchView | None, timeout: float | None) -> None:
        for reply in next(self._steps, []):
            self.done[reply.rank] = reply

    def send(self, rank: int, data: bytes) -> None:
        raise AssertionError("a launch's ranks get no command")

    def interrupt(self, rank: int) -> None:
        raise AssertionError("nothing interrupts them")

    def alive(self, rank: int) -> bool:
        return rank not in self.done

    def note_exits(self) -> None:
        return None

    def dead_ranks(self) -> list[int]:
        return []

    def stacks(
        self, ranks: list[int], collectives: bool, within_s: float | None = None
    ) -> dict[int, RankStack]:
        return {}

    def abort_collectives(self, ranks: list[int]) -> None:
        return None

    def status(self) -> list[RankStatus]:
        return []

    def died(self, world_size: int, timeout_s: float) -> BaseException:
        raise AssertionError("no rank dies")

    def seal(self, pickled: Pickled) -> bytes:
        raise AssertionError("nothing is sent")

    def stop(self, graceful: bool) -> None:
        return None


def _outcome(script: list[list[CellDone]]) -> BaseException | dict[int, CellDone]:
    driver = RankDriver(ScriptedRanks(script), 2, 2.0, False, lambda why: None)
    return driver.run_started(NullView())


def test_a_rank_that_returns_after_the_others_timed_out_returned_later() -> None:
    outcome = _outcome([[CellDone(0, 0, failure=TIMEOUT)], [CellDone(1, 0, value=b"")]])
    assert isinstance(outcome, CollectiveTimeoutError)
    assert f"Rank 1 did not arrive ({RETURNED_LATER})" in str(outcome), outcome


def test_a_rank_that_returned_before_the_timeout_had_already_returned() -> None:
    outcome = _outcome([[CellDone(1, 0, value=b"")], [CellDone(0, 0, failure=TIMEOUT)]])
    assert isinstance(outcome, CollectiveTimeoutError)
    assert f"Rank 1 did not arrive ({RETURNED})" in str(outcome), outcome


def test_a_return_read_first_but_stamped_after_the_timeout_returned_later() -> None:
    # seed 7373 of the chaos campaign (ssh / print-flood): rank 1's result, behind its 100 MB
    # of output on its host's channel, was read in the same look as rank 0's timeout
    timeout = dataclasses.replace(TIMEOUT, at=1000.0)
    late = CellDone(1, 0, value=b"", at=1000.5)
    outcome = _outcome([[late, CellDone(0, 0, failure=timeout)]])
    assert isinstance(outcome, CollectiveTimeoutError)
    assert f"Rank 1 did not arrive ({RETURNED_LATER})" in str(outcome), outcome


def test_a_return_stamped_before_the_timeout_had_already_returned_whatever_the_order() -> None:
    timeout = dataclasses.replace(TIMEOUT, at=1000.0)
    early = CellDone(1, 0, value=b"", at=990.0)
    outcome = _outcome([[early, CellDone(0, 0, failure=timeout)]])
    assert isinstance(outcome, CollectiveTimeoutError)
    assert f"Rank 1 did not arrive ({RETURNED})" in str(outcome), outcome
