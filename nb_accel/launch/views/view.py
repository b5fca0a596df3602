"""What a launch shows while it runs: the interface of a launch view, and which one is used.

The launcher feeds a view the workers' progress and metrics (:class:`~nb_accel._messages.Report`
events), their start and their failures. In a notebook the package registers the widget view
(``nb_accel.notebook``); elsewhere a text view writes to ``sys.stderr``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ..._messages import Report
from ..._registry import Registry

__all__ = [
    "VIEW_FACTORIES",
    "LaunchView",
    "NullView",
    "ViewFactory",
    "register_view_factory",
    "unregister_view_factory",
    "view_factory",
]


class LaunchView(Protocol):
    """Receives what happens in one launch, on the thread that runs the launch."""

    def started(self, rank: int, pid: int) -> None:
        """Worker ``rank`` is up."""

    def report(self, event: Report) -> None:
        """Progress and metrics from a worker."""

    def failed(self, rank: int, summary: str) -> None:
        """Worker ``rank`` failed; ``summary`` is the error's first line."""

    def returned(self, rank: int) -> None:
        """Worker ``rank``'s function returned: it is finished, never stalled."""

    def stopped(self, rank: int, reason: str) -> None:
        """Worker ``rank`` ended as a consequence of another rank's failure (``reason``, e.g.
        "rank 1 failed"). It may follow a ``failed`` call for the same rank: the launcher can
        learn only later that a failure was a knock-on effect, and this call then wins."""

    def tick(self) -> None:
        """Called about once a second while the launch runs (to mark stalled ranks)."""

    def finished(self, ok: bool) -> None:
        """The launch ended: every rank returned (``ok``) or it failed or was interrupted."""

    def restarted(self, summary: str) -> None:
        """The worker group was restarted after a failure (``max_restarts``): every rank
        starts again (``started`` follows). ``summary`` says which restart and why
        (``"restart 1 of 2 after rank 1 was killed by SIGKILL"``)."""


class NullView:
    """A view that shows nothing; subclass it to act on some of the calls only."""

    def started(self, rank: int, pid: int) -> None:
        """Nothing shown."""

    def report(self, event: Report) -> None:
        """Nothing shown."""

    def failed(self, rank: int, summary: str) -> None:
        """Nothing shown."""

    def returned(self, rank: int) -> None:
        """Nothing shown."""

    def stopped(self, rank: int, reason: str) -> None:
        """Nothing shown."""

    def tick(self) -> None:
        """Nothing shown."""

    def finished(self, ok: bool) -> None:
        """Nothing shown."""

    def restarted(self, summary: str) -> None:
        """Nothing shown."""


#: ``factory(title, world_size, all_ranks_metrics) -> view``, or None to use the text view; a
#: multi-node launch passes ``first_rank=`` too (the rank of the node's first row).
ViewFactory = Callable[..., LaunchView | None]

#: The view factories by name, the newest registered first: a launch's view is made by the
#: first (the notebook front end registers one as ``"front end"``); none: the text view.
VIEW_FACTORIES: Registry[ViewFactory] = Registry("view factory", plural="view factories")

#: The name :func:`register_view_factory` registers under unless told otherwise.
_FRONT_END = "front end"


def register_view_factory(factory: ViewFactory | None, name: str = _FRONT_END) -> None:
    """Use ``factory`` to make each launch's view (the notebook front end registers one), in
    place of the one registered as ``name`` before it (None: forget that one)."""
    if factory is None:
        VIEW_FACTORIES.unregister(name)
    else:
        VIEW_FACTORIES.register(name, factory)


def unregister_view_factory(name: str = _FRONT_END) -> None:
    """Forget the factory registered as ``name``."""
    VIEW_FACTORIES.unregister(name)


def view_factory() -> ViewFactory | None:
    """The factory registered last, if any."""
    return next(iter(VIEW_FACTORIES.values()), None)
