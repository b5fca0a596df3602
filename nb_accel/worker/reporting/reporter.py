"""Worker side of live progress and metrics: recorded cheaply, sent in the background.

Progress bars (:mod:`~nb_accel.worker.reporting.progress`) and ``Accelerator.log`` hand their news
to this process's :class:`Reporter`, which only stores it (a dictionary entry, a list append)
and wakes a background thread. That thread sends everything new as one
:class:`~nb_accel._messages.Report` at most every ``interval`` seconds, so the training loop
never waits on the kernel and the kernel gets at most about ten messages a second per rank.
:func:`flush_reporter` sends what is left; the worker calls it before it reports its result,
so the final state always arrives first.

A logged tensor is not read on the training thread (reading a GPU tensor waits for the GPU):
it is kept as a detached copy and turned into a number when its report is sent.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from ..._messages import BarState, MetricPoint, Report
from ...runtime.device_types import DeviceType, device_type
from ...runtime.rank_local import RankLocal
from .channel import EventChannel, current_channel

__all__ = [
    "REPORT_INTERVAL_S",
    "DeferredValue",
    "LoggedValue",
    "Reporter",
    "current_reporter",
    "flush_reporter",
    "numeric_values",
]

#: Shortest time between two reports of one rank (seconds): at most eight a second, so with
#: the first and the last report of a bar a rank stays under ten a second.
REPORT_INTERVAL_S = 0.125


def _devices_of(tensor: torch.Tensor) -> DeviceType | None:
    """The device type of the device ``tensor`` is on (``None``: none is registered)."""
    try:
        return device_type(tensor.device.type)
    except ValueError:
        return None


class DeferredValue:
    """A logged one-element tensor, copied (without waiting for the GPU) and read later.

    Its device type copies it (:meth:`~nb_accel.runtime.device_types.DeviceType.copy_to_host`):
    a GPU's into pinned host memory on a stream of its own, so that neither the training
    thread nor the reporter queues behind the training's GPU work; the read waits for that
    copy only.
    """

    __slots__ = ("_ready", "tensor")

    def __init__(self, tensor: torch.Tensor) -> None:
        source = tensor.detach()
        devices = _devices_of(source)
        self._ready: Callable[[], None] | None = None
        if devices is None:
            self.tensor = source.clone()
        else:
            self.tensor, self._ready = devices.copy_to_host(source)

    def read(self) -> float:
        """The value (waits for the device to have computed it)."""
        if self._ready is not None:
            self._ready()
        return float(self.tensor.item())


#: A logged value as recorded: a number, or a tensor read when its report is sent.
LoggedValue = float | DeferredValue


class Reporter:
    """Collects one worker's progress and metrics and sends them to the kernel."""

    def __init__(self, channel: EventChannel, interval: float = REPORT_INTERVAL_S) -> None:
        self._channel = channel
        self._interval = interval
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._wake = threading.Event()
        self._bars: dict[int, BarState] = {}
        self._metrics: list[tuple[int | None, dict[str, LoggedValue]]] = []
        self._notes: list[str] = []
        self._thread: threading.Thread | None = None
        self._last_send = 0.0
        self.reports_sent = 0

    def bar(self, state: BarState) -> None:
        """Record a bar's latest state (replacing any not sent yet)."""
        with self._lock:
            self._bars[state.bar] = state
        self._poke()

    def log(self, values: dict[str, LoggedValue], step: int | None) -> None:
        """Record one logged point (tensors are read when the report is sent)."""
        with self._lock:
            self._metrics.append((step, values))
        self._poke()

    def note(self, text: str) -> None:
        """Record a line for the launch view to keep on show (sent with the next report)."""
        with self._lock:
            self._notes.append(text)
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
                notes, self._notes = self._notes, []
            if not bars and not metrics and not notes:
                return
            points = tuple(_read_point(step, values) for step, values in metrics)
            report = Report(
                self._channel.rank, tuple(bars.values()), points, time.time(), tuple(notes)
            )
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


def _read_point(step: int | None, values: dict[str, LoggedValue]) -> MetricPoint:
    """A recorded point with its tensors read (on the reporter's thread, off the training loop);
    a tensor that cannot be read (a failed GPU) is left out."""
    numbers: dict[str, float] = {}
    for name, value in values.items():
        if isinstance(value, DeferredValue):
            try:
                numbers[name] = value.read()
            except RuntimeError:
                continue
        else:
            numbers[name] = value
    return step, numbers


def _is_real(dtype: torch.dtype) -> bool:
    return dtype != torch.bool and not dtype.is_complex


def numeric_values(values: dict[str, Any]) -> dict[str, LoggedValue]:
    """The entries of a ``log`` call that can be drawn: numbers and one-element tensors.

    A real-valued one-element tensor is kept as a detached copy, not read: reading it here
    would make the training loop wait for the GPU. The copy keeps the value it had when
    logged, even if the tensor changes afterwards. On XLA it is read at once (its value needs
    the training thread's graph).
    """
    found: dict[str, LoggedValue] = {}
    for name, raw in values.items():
        if isinstance(raw, torch.Tensor) and raw.device.type != "xla":
            if raw.numel() == 1 and _is_real(raw.dtype):
                found[str(name)] = DeferredValue(raw)
            continue
        value = (
            raw.item() if hasattr(raw, "item") and getattr(raw, "numel", lambda: 1)() == 1 else raw
        )
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            found[str(name)] = float(value)
    return found
