"""A launch's view and its title line: the registered front end's view (a notebook widget),
else the text view, or none."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from ..views.text_view import TextView
from ..views.view import LaunchView, NullView, view_factory

__all__ = ["make_view"]


def _print_title(title: str) -> None:
    print(title, flush=True)
    sys.stderr.flush()


def make_view(
    title: str,
    count: int,
    show_progress: bool,
    all_ranks_metrics: bool,
    first_rank: int = 0,
    always_print_title: bool = False,
    hosts: Sequence[str] | None = None,
) -> LaunchView:
    """The view of a launch of ``count`` rows, the first for rank ``first_rank`` (``hosts``:
    each rank's machine, in a launch across hosts).

    With ``show_progress``, the registered front end's view (a widget, whose header is the
    title), else the text view; without it, no view. The title is printed unless a widget
    shows it (always, with ``always_print_title``).
    """
    if always_print_title:
        _print_title(title)
    factory = view_factory() if show_progress else None
    extra: dict[str, Any] = {"first_rank": first_rank} if first_rank else {}
    if hosts is not None:
        extra["hosts"] = list(hosts)
    view = factory(title, count, all_ranks_metrics, **extra) if factory else None
    if view is not None:
        return view
    if not always_print_title:
        _print_title(title)
    if not show_progress:
        return NullView()
    return TextView(count, first_rank=first_rank, hosts=hosts)
