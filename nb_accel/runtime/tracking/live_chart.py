"""The live chart in the cell as a tracker: every process sends its numbers to the kernel."""

from __future__ import annotations

from typing import Any

from ..sinks import RankSink, current_sink
from .base import GeneralTracker

__all__ = ["LiveChartTracker"]


def _flat(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as ``outer/inner`` names (tensors are left as they are: read later)."""
    found: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            found.update(_flat(value, f"{prefix}{key}/"))
        else:
            found[f"{prefix}{key}"] = value
    return found


class LiveChartTracker(GeneralTracker):
    """The launch view's line charts: one line per logged name, each process its own.

    Always on: ``Accelerator.log`` feeds it with or without other trackers. Numbers and
    one-element tensors are drawn (nested dicts as ``outer/inner``); a tensor is not read on
    the training thread. Outside a launch it
    does nothing.
    """

    name = "live_chart"
    requires_logging_directory = False
    main_process_only = False

    @property
    def tracker(self) -> RankSink | None:
        """This rank's way to the kernel (``None`` outside a launch)."""
        return current_sink()

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Hand the values to the worker, which draws those it can."""
        sink = current_sink()
        if sink is not None:
            sink.log(_flat(values), step)
