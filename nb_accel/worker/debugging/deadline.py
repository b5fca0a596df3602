"""The launch's collective timeout, kept by the rank itself so that time at a prompt is not
counted.

torch fixes a collective's deadline when the collective starts: a rank waiting in an
``all_reduce`` for a peer that sits at a debugger prompt would time out however long the user
needs. So a launch's worker gives its process group a deadline far away
(:data:`FAR_TIMEOUT`) and keeps the launch's own with :class:`CollectiveDeadline`: a thread
that looks at torch's flight recorder every so often (a twentieth of the timeout, between 50 ms
and 5 s) for a collective of the default group that has not finished, and times how long the
rank has waited in it, less the time the kernel spent at prompts meanwhile
(:mod:`~nb_accel.worker.debugging.prompt_clock`). Past the timeout it acts once for that
collective: a cold launch's rank reports its timeout to the kernel, which ends the launch as it
ends one torch timed out; a persistent pool's rank frees its own wait
(:mod:`~nb_accel.runtime.groups.sockets`) so that the cell fails with the timeout and
the pool lives on (:func:`set_expiry`). Where torch has no flight recorder the process group
keeps the launch's timeout, as before.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from types import FrameType

from ...runtime.process_group import FAR_TIMEOUT, keep_own_deadline
from ..reporting.collective_trail import (
    C10D_FILE,
    POINT_TO_POINT,
    LastCollective,
    collective_in_flight,
)
from .prompt_clock import prompt_open, prompt_seconds

__all__ = [
    "FAR_TIMEOUT",
    "CollectiveDeadline",
    "Expired",
    "forget_in_flight",
    "set_expiry",
    "stop_watching",
    "watch_collectives",
    "watching",
]

#: Called once when a collective outlasts the timeout: the message, the collective (``all_reduce
#: #3``), the waiting thread's stack (the user's frames), and whether one of the kernel's
#: prompts was open then (a rank sat at its debugger or ``input()``).
Expired = Callable[[str, str, str, bool], None]

#: Pending collectives as the flight recorder has them (replaced in tests).
Pending = Callable[[], "tuple[int, LastCollective] | None"]

_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_active: list[CollectiveDeadline] = []


class CollectiveDeadline:
    """Times the collective the rank waits in against ``timeout_s``, prompts left out (see the
    module).

    Args:
        timeout_s: the launch's collective timeout.
        clock_path: the kernel's prompt clock file.
        expired: what to do once a collective outlasts it (once per collective; replaceable,
            as :attr:`expired`).
        pending: the collective the rank waits in, if any (torch's flight recorder).
    """

    def __init__(
        self,
        timeout_s: float,
        clock_path: str,
        expired: Expired,
        pending: Pending = collective_in_flight,
    ) -> None:
        self.timeout_s = timeout_s
        self._clock = clock_path
        self.expired = expired
        self._pending = pending
        self._waiting_thread = threading.get_ident()
        self._watched: tuple[int, float, float] | None = None
        self._fired: set[int] = set()
        self._forgotten_ns = 0
        self._frame: FrameType | None = None
        self._frame_key = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start watching, on a thread of its own."""
        self._thread = threading.Thread(
            target=self._run, name="nb_accel-collective-deadline", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop watching and wait for the thread to end."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def set_timeout(self, seconds: float) -> None:
        """Bound the collectives by ``seconds`` from now on (``InitProcessGroupKwargs``)."""
        self.timeout_s = seconds

    def interval_s(self) -> float:
        """How often the flight recorder is read."""
        return min(5.0, max(0.05, self.timeout_s / 20))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s()):
            with self._lock:  # see forget_in_flight
                found = self.overdue(time.monotonic())
                if found is None:
                    continue
                seconds = f"{self.timeout_s:g}"
                message = (
                    f"Timed out after {seconds} s waiting in {found.describe()} (the "
                    "launch's collective timeout)"
                )
                at_prompt = prompt_open(self._clock)
                try:
                    self.expired(message, found.describe(), self._waiting_stack(), at_prompt)
                except Exception:  # noqa: BLE001 - the group went meanwhile: keep watching
                    continue

    def forget_in_flight(self) -> None:
        """The waiting thread has moved on (its command ended): the collectives it entered
        until now are never acted on (an entry retires a moment after its error). Atomic with
        the deadline's action: that comes before this, or not at all."""
        with self._lock:
            self._forgotten_ns = time.time_ns()
            self._watched = None
            self._frame = None

    def _waiting_in(self) -> tuple[int, LastCollective] | None:
        """The collective in flight (the flight recorder's), else a call the waiting thread
        makes into torch.distributed that the recorder does not show (gloo's send and recv)."""
        return self._pending() or self._blocking_call()

    def _blocking_call(self) -> tuple[int, LastCollective] | None:
        """A blocking ``send`` or ``recv`` the waiting thread is inside, numbered below 0: one
        number per call (the call's frame is held while it is watched, so that the next
        call's frame cannot take its place unseen)."""
        frame = sys._current_frames().get(self._waiting_thread)
        if (
            frame is None
            or frame.f_code.co_name not in POINT_TO_POINT
            or not frame.f_code.co_filename.endswith(C10D_FILE)
        ):
            self._frame = None
            return None
        if frame is not self._frame:
            self._frame, self._frame_key = frame, self._frame_key - 1
        return self._frame_key, LastCollective(
            op=frame.f_code.co_name, sequence=0, point_to_point=True
        )

    def overdue(self, now: float) -> LastCollective | None:
        """The collective the rank has waited in for longer than the timeout at ``now`` (time
        at prompts left out), else ``None``; a collective is found overdue once."""
        pending = self._waiting_in()
        if pending is None:
            self._watched = None
            return None
        record, collective = pending
        if record in self._fired:  # acted on already (its entry may stay after an abort)
            return None
        if 0 < collective.created_ns <= self._forgotten_ns:  # entered by an ended command
            return None
        prompts = prompt_seconds(self._clock, now)
        if self._watched is None or self._watched[0] != record:
            self._watched = (record, now, prompts)
            return None
        _, since, prompts_then = self._watched
        waited = (now - since) - (prompts - prompts_then)
        if waited < self.timeout_s:
            return None
        self._fired.add(record)
        return collective

    def _waiting_stack(self) -> str:
        """The stack of the thread that waits, nb_accel's frames left out."""
        frame = sys._current_frames().get(self._waiting_thread)
        if frame is None:
            return ""
        frames = [
            f
            for f in traceback.extract_stack(frame)
            if not os.path.abspath(f.filename).startswith(_PACKAGE)
        ]
        return "Traceback (most recent call last):\n" + "".join(traceback.format_list(frames))


def watch_collectives(timeout_s: float, clock_path: str, expired: Expired) -> CollectiveDeadline:
    """Start keeping the launch's collective timeout for the calling thread (see the module)."""
    stop_watching()
    deadline = CollectiveDeadline(timeout_s, clock_path, expired)
    deadline.start()
    _active.append(deadline)
    keep_own_deadline(deadline)
    return deadline


def watching() -> bool:
    """Whether this rank keeps its collective deadline itself (its process groups are then
    made with :data:`FAR_TIMEOUT`)."""
    return bool(_active)


def set_expiry(expired: Expired) -> None:
    """What the deadline kept now does once a collective outlasts it, from now on."""
    for deadline in _active:
        deadline.expired = expired


def forget_in_flight() -> None:
    """See :meth:`CollectiveDeadline.forget_in_flight`."""
    for deadline in _active:
        deadline.forget_in_flight()


def stop_watching() -> None:
    """Stop keeping the deadline (the function has returned)."""
    keep_own_deadline(None)
    while _active:
        _active.pop().stop()
