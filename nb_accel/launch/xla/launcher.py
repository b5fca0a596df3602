"""Launching on XLA devices (TPUs) through ``torch_xla``'s ``xmp.spawn``: the launch backend of
the XLA device type (``runtime/xla/device_type.py``), which a kernel on a TPU runtime launches on.

The workers are forked by ``xmp.spawn`` (one process per TPU chip, one rank per XLA device:
``runtime/xla/tpu_plan.py``; :mod:`.spawner`) and report over one pipe, with the events every
launch uses, passed to the shared dispatcher: their output and progress reach the cell as they
happen, results come back in rank order, and a worker's exception is re-raised in the kernel
with its type, its traceback as the cause and its rank in a note. What a worker process writes
to its file descriptors 1 and 2 (the TPU runtime's C++ logs, ``os.write``) reaches the cell
too, and explains its death (:mod:`.output`).

``torch_xla`` is imported only when an :class:`XlaLauncher` is made, and in the workers.
"""

from __future__ import annotations

import multiprocessing
import os
from typing import Any, ClassVar

from ..._messages import TrackerRun
from ...worker.transfer.pickling import Pickled
from ..driver.driver import RankDriver
from ..launchers.backend import LaunchBackend
from ..launchers.outcome import load_result
from ..payload import make_payload
from ..request import LaunchCall
from ..spec import LaunchSpec
from .output import ProcessOutputs
from .ranks import XlaRanks
from .settings import xla_worker_settings
from .spawner import Spawner

__all__ = ["XlaLauncher"]


class XlaLauncher(LaunchBackend):
    """The ranks of an XLA launch, forked by ``xmp.spawn`` (one process per TPU chip).

    The workers report over one pipe; the processes' file descriptors 1 and 2 are pipes of
    their own (:class:`~nb_accel.launch.xla.output.ProcessOutputs`).
    """

    name: ClassVar[str] = "xla"
    prints_title: ClassVar[bool] = True

    @classmethod
    def runs(cls, spec: LaunchSpec) -> bool:
        """A launch on a device type that needs this backend (XLA devices)."""
        return spec.device.launcher == cls.name

    def __init__(self, spec: LaunchSpec, call: LaunchCall) -> None:
        from ...runtime.xla.device_type import XlaDevices, import_xla
        from ...worker.xla.main import run_xla_worker

        devices = spec.device
        assert isinstance(devices, XlaDevices), "an XLA launch runs on XLA devices"
        xmp = import_xla()
        plan = devices.layout(spec.plan.num_processes)
        super().__init__(spec, call)
        self._expected = plan.ranks
        self._outputs = ProcessOutputs(plan.processes, plan.threads_per_process, plan.ranks)
        self._context = multiprocessing.get_context("fork")
        self._reader, self._writer = self._context.Pipe(duplex=False)
        before = {child.pid for child in multiprocessing.active_children()}
        assert isinstance(self.payload, Pickled), "an XLA launch sends its call pickled"
        # the big buffers inside the bytes: xmp.spawn forks the workers from a thread of its own
        sealed = self.payload.seal(None)
        spawn_args = (sealed, xla_worker_settings(spec.plan), os.getpid())
        self._spawner = Spawner(xmp, run_xla_worker, spawn_args, plan.spawn_nprocs)
        self._ranks = XlaRanks(
            self._outputs, self.printer, self._reader, self._spawner, before, plan.ranks
        )

    def make_payload(self, call: LaunchCall) -> Pickled:
        """The call pickled: the workers get it from ``xmp.spawn``'s arguments."""
        return make_payload(call.function, call.args, call.kwargs)

    def start(self) -> None:
        """Hand the workers their pipes, and run ``xmp.spawn`` in its thread."""
        from ...worker.process.process_fds import set_process_pipes
        from ...worker.xla.main import SharedWriter, set_launch_pipe

        set_launch_pipe(SharedWriter(self._writer, self._context.Lock()))
        set_process_pipes(self._outputs.pipes())
        self._spawner.start()

    def wait(self) -> list[Any] | BaseException:
        """Run the function on the ranks to its outcome (the one driver's): the results in
        rank order, or the exception to raise."""
        driver = RankDriver(
            self._ranks,
            self._expected,
            0.0,  # XLA collectives keep no deadline of nb_accel's
            detached_collectives=False,
            give_up=lambda why: None,  # a launch's ranks are stopped after it anyway
        )
        outcome = driver.run_started(self.view)
        if isinstance(outcome, BaseException):
            return outcome
        return [load_result(rank, reply.value or b"") for rank, reply in sorted(outcome.items())]

    def runs_left_open(self) -> list[TrackerRun]:
        """The tracker runs the ranks opened and were not heard ending."""
        return list(self._ranks.events.open_runs.values())

    def stop(self, graceful: bool = False) -> None:
        """Stop the workers if they still run (``xmp.spawn`` then returns), take the pipes
        back and show what the workers wrote last."""
        from ...worker.process.process_fds import set_process_pipes
        from ...worker.xla.main import set_launch_pipe

        self._ranks.stop(graceful)
        set_launch_pipe(None)
        set_process_pipes(None)
        self.printer.flush()
        self._reader.close()
        self._writer.close()
