"""The rendezvous watch of a node agent: it asks the store in the background while the agent
monitors its workers, and asks nothing while a rendezvous round runs."""

from __future__ import annotations

import threading

import pytest

from nb_accel.launch.multinode.unanswered import RendezvousWatch

pytestmark = pytest.mark.timeout(60)


def test_the_watch_asks_nothing_while_a_rendezvous_round_runs() -> None:
    """Torch's handler keeps one rendezvous state: while a round runs (the agent's thread
    reads and writes it) the watch's thread asks nothing, and asks again after the round."""
    asked: list[str] = []
    answered = threading.Event()

    class Handler:
        def num_nodes_waiting(self) -> int:
            asked.append("count")
            answered.set()
            return 0

        def is_closed(self) -> bool:
            return False

    watch = RendezvousWatch(Handler(), 0.01)
    watch.start()
    try:
        assert answered.wait(10)
        with watch.quiet():
            before = len(asked)
            done = threading.Event()
            done.wait(0.3)  # thirty intervals of the watch, in which it would have asked
            assert len(asked) == before
        answered.clear()
        assert answered.wait(10), "the watch did not ask again after the round"
    finally:
        watch.stop()


def test_the_watch_says_whether_the_store_answered_as_it_stops() -> None:
    """A watch whose question the store never answers says so as it stops: the rendezvous'
    close, asked of the same store, is then not waited for as long (a node cut off from its
    store ended seconds sooner)."""
    asked, release = threading.Event(), threading.Event()

    class Handler:
        def num_nodes_waiting(self) -> int:
            asked.set()
            release.wait(30)  # a store cut off: no answer until the test lets it go
            return 0

        def is_closed(self) -> bool:
            return False

    unanswered = RendezvousWatch(Handler(), 0.01)
    unanswered.start()
    try:
        assert asked.wait(10)
        assert unanswered.stop(0.1) is False
    finally:
        release.set()
    assert unanswered.stop() is True  # its question answered at last: the thread ended
    answered = RendezvousWatch(Handler(), 0.01)
    answered.start()
    assert answered.stop() is True


def test_the_watch_s_end_still_closes_the_rendezvous_of_a_store_that_did_not_answer() -> None:
    """Its close is still asked of a store that left the watch's question unanswered (it
    may come back), on a thread of its own, and left there; ``None`` leaves it open."""
    asked, release, closing = threading.Event(), threading.Event(), threading.Event()

    class Handler:
        def num_nodes_waiting(self) -> int:
            asked.set()
            release.wait(30)
            return 0

        def is_closed(self) -> bool:
            return False

    def close() -> None:
        closing.set()
        release.wait(30)  # no answer from the store either

    watch = RendezvousWatch(Handler(), 0.01)
    watch.start()
    try:
        assert asked.wait(10)
        watch.end(0.1, close)
        assert closing.wait(10), "the rendezvous' close was never asked"
    finally:
        release.set()
    left_open = RendezvousWatch(Handler(), 0.01)
    left_open.start()
    left_open.end(0.1, None)
    assert watch.stop() and left_open.stop()
