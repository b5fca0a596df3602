"""Calls to the rendezvous store that may never be answered.

A call to a store whose host was cut off from the network waits as long as the system keeps
the connection (many minutes): torch's store timeouts are the server's to send. The node's
agent asks the store on every turn of its loop whether nodes are waiting to join, and closes
the rendezvous as it ends; on a node cut off from the store, either would keep the node (and
its notebook's cell) waiting for minutes after its workers gave up. Here the loop reads the
answer a background thread last got (which also tells that another node closed the
rendezvous: it ended the launch), and the end waits a few seconds at most (half a second
after the user's interrupt); a call that never returns is left to its thread (a daemon).

A store that does not answer also holds a node in its rendezvous round, in native code where
the notebook's interrupt is not heard (node 0 frozen, or its kernel busy): the round runs on
a thread of its own, waited for in short steps (:func:`heard_out`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

__all__ = [
    "END_WAIT_S",
    "INTERRUPTED_END_S",
    "RendezvousWatch",
    "heard_out",
    "returned_within",
]

#: How long a node's agent waits, as it ends, for the store to take its last word.
END_WAIT_S = 5.0
#: As long, once its user interrupted the node: the stop button ends the cell at once; and
#: for the rendezvous' close once the store left the watch's last question unanswered.
INTERRUPTED_END_S = 0.5
#: How often a thread waiting for a call on another (:func:`heard_out`) looks up.
_STEP_S = 0.1
_T = TypeVar("_T")


class RendezvousWatch:
    """The handler's ``num_nodes_waiting`` and ``is_closed``, asked by a background thread
    every ``interval_s`` once :meth:`start` ran. A call returns the last count of nodes
    waiting to join (0 before the first answer), or raises the error the store's call
    raised, never waiting for the store; :attr:`closed` says whether another node closed
    the rendezvous (it ended the launch). It is :meth:`quiet` while the agent runs a
    rendezvous round: torch's handler keeps one state that a round and a question would both
    read and write (with the state read anew on every look, a round lost its changes to the
    watch's questions, and took seconds more to complete)."""

    def __init__(self, handler: Any, interval_s: float) -> None:
        self._count: Callable[[], int] = handler.num_nodes_waiting
        self._is_closed: Callable[[], bool] = handler.is_closed
        self._interval_s = interval_s
        self._last = 0
        self._error: BaseException | None = None
        #: Whether the rendezvous was closed at the last answer.
        self.closed = False
        self._stop = threading.Event()
        self._quiet = threading.Event()  # a rendezvous round runs: not a word to the store
        self._silenced = False  # the run is over but for a worker left running
        self._asking = threading.Lock()  # held while a question is in flight
        self._thread = threading.Thread(
            target=self._run, name="nb_accel-rendezvous-watch", daemon=True
        )

    def __call__(self) -> int:
        """How many nodes were waiting to join at the last answer."""
        if self._error is not None and not self._silenced:
            raise self._error
        return self._last

    def silence(self) -> None:
        """Ask no more, and raise nothing: the run is over but for a worker the agent leaves
        running (one that waits for ``%debug``), and the rendezvous no longer matters (its
        store may have gone with the node that hosted it)."""
        self._silenced = True
        self._quiet.set()

    def start(self) -> None:
        """Start asking."""
        self._thread.start()

    def stop(self, wait_s: float = END_WAIT_S) -> bool:
        """Stop asking, waiting ``wait_s`` at most for a call in flight; a call still waiting
        for the store then is left to its thread. Whether the store answered (no call was
        left waiting): one that did not will not answer the rendezvous' close either."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(wait_s)
        return not self._thread.is_alive()

    def end(self, wait_s: float, close: Callable[[], object] | None) -> None:
        """:meth:`stop`, then ``close`` (the rendezvous' close; ``None``: left open), waited
        for ``wait_s`` at most, or :data:`INTERRUPTED_END_S` where the store left the last
        question unanswered (it will not answer the close either: its call is left to its
        thread)."""
        answered = self.stop(wait_s)
        if close is not None:
            returned_within(wait_s if answered else INTERRUPTED_END_S, close)

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """No asking while the block runs (a rendezvous round: the handler's state is then
        the round's alone, as torch stops its own heartbeats for it), once a question in
        flight was answered (or :data:`END_WAIT_S` passed: the store does not answer)."""
        self._quiet.set()
        if self._asking.acquire(timeout=END_WAIT_S):  # else the question is left to its thread
            self._asking.release()
        try:
            yield
        finally:
            self._quiet.clear()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            with self._asking:
                if self._quiet.is_set():
                    continue
                try:
                    self._last = self._count()
                    self.closed = self._is_closed()
                except Exception as error:  # noqa: BLE001 - raised in the agent's loop instead
                    self._error = error
                    return


def returned_within(seconds: float, call: Callable[[], object]) -> bool:
    """Run ``call`` in a thread of its own; whether it returned (or raised) within
    ``seconds``. Its error, if any, is dropped: the store's host may be gone."""
    done = threading.Event()

    def run() -> None:
        try:
            call()
        except Exception:  # noqa: BLE001 - a store that is gone is the expected case
            pass
        finally:
            done.set()

    threading.Thread(target=run, name="nb_accel-store-end", daemon=True).start()
    return done.wait(seconds)


def heard_out(call: Callable[[], _T]) -> _T:
    """What ``call`` returns, made on a thread of its own while this one waits in short
    steps, so that an interrupt is heard at once here: a call to a store that does not
    answer holds its thread in native code until the store's timeout (a minute). Raises what
    ``call`` raised; interrupted, the call is left to its thread (a daemon), which ends when
    the store answers or times out."""
    done = threading.Event()
    outcome: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as error:  # noqa: BLE001 - raised on the waiting thread
            outcome.append((False, error))
        finally:
            done.set()

    thread = threading.Thread(target=run, name="nb_accel-rendezvous-round", daemon=True)
    thread.start()
    while not done.wait(_STEP_S):
        pass
    thread.join()  # it has set the event: nothing of it is left
    returned, value = outcome[0]
    if not returned:
        raise value
    return value  # type: ignore[no-any-return]
