"""A launch backend: a :class:`~.interface.Launcher` made from a launch's spec and call.

Each way of running a ``notebook_launcher`` call (this machine's processes, torch's elastic agent
across nodes, hosts over SSH or SLURM, XLA devices) is one subclass; :mod:`nb_accel.launch.backends`
keeps them in the order they are considered and picks the first whose :meth:`LaunchBackend.runs`
takes the spec. What they all do alike is done here once: the payload made as the backend sends
it, the plan's notes shown, the view and the printer of the workers' output made from the spec.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar

from ..payload import LaunchPayload, launch_payload
from ..plan import show_notes
from ..request import LaunchCall
from ..spec import LaunchSpec
from ..views.output import OutputPrinter
from .interface import Launcher
from .view import make_view

__all__ = ["LaunchBackend"]


class LaunchBackend(Launcher):
    """One way of running a launch, chosen from its spec.

    Made before anything starts: a call that cannot travel to the workers, and any check of
    the backend's own, raise here, with nothing running.

    Args:
        spec: the launch, resolved and checked.
        call: what every rank runs.
    """

    #: The backend's name in the registry (and in a device type's ``launcher``).
    name: ClassVar[str]
    #: True when the launch's title line is printed even where a widget shows it.
    prints_title: ClassVar[bool] = False

    @classmethod
    @abstractmethod
    def runs(cls, spec: LaunchSpec) -> bool:
        """True when this backend runs launches like ``spec`` (the registry asks the backends
        in order; the first that says so runs it)."""

    def __init__(self, spec: LaunchSpec, call: LaunchCall) -> None:
        self.spec = spec
        self.payload = self.make_payload(call)
        show_notes(spec.plan)
        output = spec.output
        view = make_view(
            self.title(),
            spec.ranks_heard,
            output.show_progress,
            output.all_ranks_metrics,
            spec.first_rank,
            always_print_title=self.prints_title,
            hosts=spec.rank_hosts,
        )
        #: Writes the workers' output; its view is the launch's.
        self.printer = OutputPrinter(
            spec.world_size,
            output.prefix_output,
            view=view,
            place_of=spec.place_of(),
            template=output.prefix_template,
            per_node=spec.plan.num_processes,
        )
        self.view = self.printer.view  # the held output first at each change of state

    def make_payload(self, call: LaunchCall) -> LaunchPayload:
        """The call as this backend's workers receive it: the call itself where they are forked
        from this process (they inherit it), else pickled."""
        inherited = self.spec.plan.start_method == "fork"
        return launch_payload(call.function, call.args, call.kwargs, inherited)

    def title(self) -> str:
        """The launch's title line."""
        return self.spec.title
