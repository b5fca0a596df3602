"""The live chart in the cell as a tracker: every process sends its numbers to the kernel."""

from __future__ import annotations

from typing import Any

from ..reporting.reporter import Reporter, current_reporter, numeric_values
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
    the training thread (see :mod:`~nb_accel.runtime.reporting.reporter`). Outside a launch it
    does nothing.
    """

    name = "live_chart"
    requires_logging_directory = False
    main_process_only = False

    @property
    def tracker(self) -> Reporter | None:
        """This process's reporter (``None`` outside a launch)."""
        return current_reporter()

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Hand the drawable values to the reporter."""
        reporter = current_reporter()
        if reporter is not None:
            numbers = numeric_values(_flat(values))
            if numbers:
                reporter.log(numbers, step)
