"""A launch view for tests that keeps what each rank was last shown as."""

from __future__ import annotations

from nb_accel.launch.views.view import NullView


class ShownRows(NullView):
    """What each rank was last shown as: ``rows[rank]`` is ``("failed", summary)`` or
    ``("stopped", reason)``."""

    def __init__(self) -> None:
        self.rows: dict[int, tuple[str, str]] = {}

    def failed(self, rank: int, summary: str) -> None:
        """Keep it."""
        self.rows[rank] = ("failed", summary)

    def stopped(self, rank: int, reason: str) -> None:
        """Keep it."""
        self.rows[rank] = ("stopped", reason)
