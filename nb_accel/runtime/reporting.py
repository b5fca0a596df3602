"""Worker side of live progress and metrics: recorded cheaply, sent in the background.

Progress bars (:mod:`~nb_accel.runtime.progress`) and ``Accelerator.log`` hand their news to
this process's :class:`Reporter`, which only stores it (a dictionary entry, a list append)
and wakes a background thread. That thread sends everything new as one
:class:`~nb_accel._messages.Report` at most every ``interval`` seconds, so the training loop
never waits on the kernel and the kernel gets at most about ten messages a second per rank.
:func:`flush_reporter` sends what is left; the worker calls it before it reports its result,
so the final state always arrives first.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from .._messages import BarState, MetricPoint, Report
from .channel import EventChannel, current_channel
from .rank_local import RankLocal

__all__ = ["REPORT_INTERVAL_S", "Reporter", "current_reporter", "flush_reporter"]

#: Shortest time between two reports of one rank (seconds): at most eight a second, so with
#: the first and the last report of a bar a rank stays under ten a second.
REPORT_INTERVAL_S = 0.125


class Reporter:
    """Collects one worker's progress and metrics and sends them to the kernel."""

    def __init__(self, channel: EventChannel, interval: float = REPORT_INTERVAL_S) -> None:
        self._channel = channel
        self._interval = interval
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._wake = threading.Event()
        self._bars: dict[int, BarState] = {}
        self._metrics: list[MetricPoint] = []
        self._thread: threading.Thread | None = None
        self._last_send = 0.0
        self.reports_sent = 0

    def bar(self, state: BarState) -> None:
        """Record a bar's latest state (replacing any not sent yet)."""
        with self._lock:
            self._bars[state.bar] = state
        self._poke()

    def log(self, values: dict[str, float], step: int | None) -> None:
        """Record one logged point."""
        with self._lock:
            self._metrics.append((step, values))
        self._poke()

    def _poke(self) -> None:
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name="nb_accel-reporter", daemon=True
                    )
                    self._thread.start()
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            delay = self._last_send + self._interval - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            self.flush()

    def flush(self) -> None:
        """Send everything recorded and not sent yet, now (from any thread)."""
        with self._send_lock:
            with self._lock:
                bars, self._bars = self._bars, {}
                metrics, self._metrics = self._metrics, []
            if not bars and not metrics:
                return
            report = Report(self._channel.rank, tuple(bars.values()), tuple(metrics), time.time())
            self._channel.send(report)
            self._last_send = time.monotonic()
            self.reports_sent += 1


_reporter: RankLocal[Reporter | None] = RankLocal(lambda: None)
_reporter_lock = threading.Lock()


def current_reporter() -> Reporter | None:
    """This rank's reporter (created on first use), or ``None`` outside a launch."""
    channel = current_channel()
    if channel is None:
        return None
    reporter = _reporter.get()
    if reporter is None or reporter._channel is not channel:
        with _reporter_lock:
            reporter = _reporter.get()
            if reporter is None or reporter._channel is not channel:
                reporter = Reporter(channel)
                _reporter.set(reporter)
    return reporter


def flush_reporter() -> None:
    """Send this rank's pending progress and metrics (a no-op when there are none)."""
    reporter = _reporter.get()
    if reporter is not None:
        reporter.flush()


def numeric_values(values: dict[str, Any]) -> dict[str, float]:
    """The entries of a ``log`` call that can be drawn: numbers and one-element tensors."""
    found: dict[str, float] = {}
    for name, raw in values.items():
        value = (
            raw.item() if hasattr(raw, "item") and getattr(raw, "numel", lambda: 1)() == 1 else raw
        )
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            found[str(name)] = float(value)
    return found
