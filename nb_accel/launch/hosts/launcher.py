"""A launch across hosts driven from the kernel: a node process on each host (over SSH, or
``srun`` in a SLURM allocation) runs torch's elastic agent for that host's ranks, and sends
every worker's events back over its channel.

The kernel starts the node processes, reads each one's hello and checks its versions against
its own before anything else starts; host 0's free port (on the address the others reach it
at) becomes the c10d rendezvous, which host 0's agent listens on. Then each host gets its
:class:`~nb_accel._messages.NodeJob` (the function and its arguments travel in it: no shared
filesystem is needed). The ranks (:class:`~.launched_ranks.LaunchedHostRanks`) run that
function as their one command, and the one driver
(:class:`~nb_accel.launch.driver.driver.RankDriver`) runs it to its outcome, as it runs a
launch on this machine's processes: results in rank order, failures judged across hosts (each
names its host). When the launch fails or is interrupted, or the kernel goes away, every host
stops its workers.
"""

from __future__ import annotations

from typing import Any, ClassVar

from ...worker.transfer.pickling import Pickled
from ..driver.driver import RankDriver
from ..launchers.backend import LaunchBackend
from ..launchers.outcome import load_result
from ..payload import LaunchPayload, launch_payload
from ..request import LaunchCall
from ..spec import LaunchSpec
from .connections import GRACEFUL_STOP_S, HOST_STOP_GRACE_S
from .launched_ranks import LaunchedHostRanks

__all__ = ["HostsLauncher"]


class HostsLauncher(LaunchBackend):
    """A launch of ``plan.num_processes`` ranks on each of the spec's hosts, driven from here."""

    name: ClassVar[str] = "hosts"

    @classmethod
    def runs(cls, spec: LaunchSpec) -> bool:
        """A launch with hosts."""
        return spec.device.launcher is None and spec.hosts is not None

    def __init__(self, spec: LaunchSpec, call: LaunchCall) -> None:
        super().__init__(spec, call)
        assert spec.hosts is not None, "a launch across hosts has hosts"
        self._plan = spec.plan
        self._ranks = LaunchedHostRanks(spec.plan, spec.hosts, self.printer)

    def make_payload(self, call: LaunchCall) -> LaunchPayload:
        """The call pickled, with the function's own module by value unless installed: the
        hosts may not have the user's files."""
        return launch_payload(call.function, call.args, call.kwargs, False, elsewhere=True)

    @property
    def world_size(self) -> int:
        """Ranks in the launch."""
        return self.spec.world_size

    def start(self) -> None:
        """Start every host's node process, check their versions, and send the jobs."""
        if not isinstance(self.payload, Pickled):
            raise TypeError("a launch across hosts sends its call pickled")
        self._ranks.start_with(self.payload.seal(None))  # no shared memory across hosts

    def wait(self) -> list[Any] | BaseException:
        """Run the call on every host's ranks to its outcome: the results in rank order, or
        the exception to raise."""
        plan = self._plan
        driver = RankDriver(
            self._ranks,
            self.world_size,
            plan.timeout_s,
            plan.device.detached_collectives(plan.backend),
            give_up=lambda why: None,  # a launch's ranks are stopped after it anyway
        )
        outcome = driver.run_started(self.view)
        if isinstance(outcome, BaseException):
            return outcome
        return [load_result(rank, reply.value or b"") for rank, reply in sorted(outcome.items())]

    def stop(self, graceful: bool = False) -> None:
        """Tell every host to stop, give them :data:`HOST_STOP_GRACE_S` (more after a success),
        then cut their channels."""
        self._ranks.stop_hosts(GRACEFUL_STOP_S if graceful else HOST_STOP_GRACE_S)
