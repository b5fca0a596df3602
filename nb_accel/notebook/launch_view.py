"""The notebook's launch view: the progress widget, displayed in the cell that launches.

:func:`notebook_view` is registered with the launcher by the package (``nb_accel``), so a
launch from a Jupyter kernel shows one widget in the cell's output; anywhere else, or where
``NB_ACCEL_VIEW=text`` asks for it (a front end that cannot draw widgets), it returns ``None``
and the launcher falls back to its text view. ipywidgets is imported only when a
widget is actually made.
"""

from __future__ import annotations

from collections.abc import Sequence

from .. import _env
from ..launch.views.view import LaunchView

__all__ = ["notebook_view"]


def notebook_view(
    title: str,
    world_size: int,
    all_ranks_metrics: bool,
    first_rank: int = 0,
    hosts: Sequence[str] | None = None,
) -> LaunchView | None:
    """A displayed :class:`~nb_accel.notebook.progress_widget.ProgressWidget` in a Jupyter
    kernel, else ``None`` (``first_rank``: the first row's rank, on a later node; ``hosts``:
    each rank's machine, in a launch across hosts)."""
    if not _env.in_notebook() or _env.text_view_asked():
        return None
    try:
        from IPython.display import display

        from .compat_widgets import ready_front_end
        from .progress_widget import ProgressWidget
    except ImportError:  # ipywidgets missing: the text view will do
        return None
    ready_front_end()
    view = ProgressWidget(
        title, world_size, all_ranks_metrics=all_ranks_metrics, first_rank=first_rank, hosts=hosts
    )
    display(view.widget)
    return view
