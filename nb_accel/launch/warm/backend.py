"""The launch backend of ``reuse_workers=True``: the launch runs on the kernel's warm workers
(:mod:`.kept`), started by the first such launch (or by ``%%distributed``) and left running
after it. A launch of another shape (ranks, hosts, start method, devices, precision, sharding)
replaces them, and a line says what differed."""

from __future__ import annotations

import sys
from typing import Any, ClassVar

from ..launchers.backend import LaunchBackend
from ..payload import LaunchPayload, launch_payload
from ..pool import WorkerPool
from ..request import LaunchCall
from ..spec import LaunchSpec
from .kept import keep_pool, kept_pool, stop_workers

__all__ = ["LOST_NOTE", "REPLACED_NOTE", "WarmLauncher"]

#: The line a launch of another shape prints when it replaces the warm workers.
REPLACED_NOTE = "The warm workers ran with {differs}: replaced by {workers}"
#: The line a launch prints when the warm workers it would have used had stopped.
LOST_NOTE = (
    "The warm workers had stopped ({why}): starting fresh ones; what they kept (residents, "
    "imports, the process group) is gone"
)


class WarmLauncher(LaunchBackend):
    """Runs a launch on the kernel's warm workers, starting them if there are none."""

    name: ClassVar[str] = "warm"

    @classmethod
    def runs(cls, spec: LaunchSpec) -> bool:
        """Every launch with ``reuse_workers=True``."""
        return spec.reuse_workers

    def __init__(self, spec: LaunchSpec, call: LaunchCall) -> None:
        self._call = call
        self._pool: WorkerPool | None = None
        super().__init__(spec, call)

    def _reusable(self, pool: WorkerPool | None) -> bool:
        """Whether ``pool`` runs, with this launch's shape."""
        return pool is not None and pool.running and pool.spec.shape == self.spec.shape

    def make_payload(self, call: LaunchCall) -> LaunchPayload:
        """The call itself: :meth:`WorkerPool.call` pickles it when it is sent."""
        return launch_payload(call.function, call.args, call.kwargs, True)

    def title(self) -> str:
        """The launch's line, saying whether it starts the warm workers or reuses them."""
        if self._reusable(kept_pool()):
            return "On warm workers: " + self.spec.describe_pool()
        return self.spec.title + ", kept warm"

    def start(self) -> None:
        """Have the warm workers ready: the kept ones if they match, else fresh ones."""
        pool = kept_pool()
        if pool is not None and not self._reusable(pool):
            if pool.running:
                differs = pool.spec.shape.differences(self.spec.shape)
                note = REPLACED_NOTE.format(
                    differs=", ".join(differs), workers=self.spec.describe_pool()
                )
            else:
                note = LOST_NOTE.format(why=pool.stopped_because or "a rank died")
            print(note, file=sys.stderr, flush=True)
            stop_workers()
            pool = None
        if pool is None:
            pool = WorkerPool(spec=self.spec)
            pool.start(notes=False)  # the launch has shown them
            keep_pool(pool)
        self._pool = pool

    def wait(self) -> list[Any] | BaseException:
        """Run the call on every warm worker: the results in rank order, or the exception to
        raise (a rank's failure leaves the workers warm; a dead rank is replaced)."""
        assert self._pool is not None, "start() first"
        call = self._call
        try:
            return self._pool.call(
                call.function,
                call.args,
                call.kwargs,
                all_output=True,
                prefix_output=self.spec.output.prefix_output,
                view=self.view,
            )
        except Exception as error:  # noqa: BLE001 - the launch's outcome, raised by the caller
            return error

    def stop(self, graceful: bool = False) -> None:
        """Nothing: the workers stay warm for the next launch (a pool a rank's death stopped
        stays known until then, so that the next warm launch can say what was lost)."""
