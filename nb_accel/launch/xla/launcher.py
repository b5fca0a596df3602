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
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import wait
from typing import Any, ClassVar

from ..._messages import Output, Started, TrackerRun, decode
from ...errors import WorkerDiedError
from ...worker.transfer.pickling import Pickled
from ..launchers.backend import LaunchBackend
from ..launchers.dispatch import DispatchHooks, EventDispatcher
from ..launchers.outcome import failure_outcome, load_result
from ..launchers.stopping import stop_processes
from ..payload import make_payload
from ..request import LaunchCall
from ..spec import LaunchSpec
from .output import ProcessOutputs
from .settings import xla_worker_settings
from .spawner import Spawner, new_children

__all__ = ["XlaLauncher"]

#: How long stopped workers may take to be reaped by ``xmp.spawn`` (seconds).
REAP_S = 30.0
#: How often the watching loop looks whether ``xmp.spawn`` has returned (seconds).
POLL_S = 0.05


class _FdFirst(DispatchHooks):
    """What the worker processes wrote to their file descriptors 1 and 2 is shown before a
    change of a rank's state; a started rank tells which process runs it."""

    def __init__(self, outputs: ProcessOutputs, show: Callable[[Output], None]) -> None:
        self._outputs = outputs
        self._show = show

    def before_change(self, sender: Any) -> None:
        """Show what every worker process wrote so far."""
        for event in self._outputs.read_all():
            self._show(event)

    def started(self, event: Started, sender: Any) -> None:
        """Note the process of the started rank."""
        self._outputs.started(event.rank, event.pid)


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
        printer = self.printer
        self._events = EventDispatcher(
            printer, self.view, _FdFirst(self._outputs, printer), printer.flush_due
        )
        self._context = multiprocessing.get_context("fork")
        self._reader, self._writer = self._context.Pipe(duplex=False)
        self._before = {child.pid for child in multiprocessing.active_children()}
        assert isinstance(self.payload, Pickled), "an XLA launch sends its call pickled"
        # the big buffers inside the bytes: xmp.spawn forks the workers from a thread of its own
        sealed = self.payload.seal(None)
        spawn_args = (sealed, xla_worker_settings(spec.plan), os.getpid())
        self._spawner = Spawner(xmp, run_xla_worker, spawn_args, plan.spawn_nprocs)

    def make_payload(self, call: LaunchCall) -> Pickled:
        """The call pickled: the workers get it from ``xmp.spawn``'s arguments."""
        return make_payload(call.function, call.args, call.kwargs)

    def _show(self, events: list[Output]) -> None:
        for event in events:
            self.printer(event)

    def start(self) -> None:
        """Hand the workers their pipes, and run ``xmp.spawn`` in its thread."""
        from ...worker.process.process_fds import set_process_pipes
        from ...worker.xla.main import SharedWriter, set_launch_pipe

        set_launch_pipe(SharedWriter(self._writer, self._context.Lock()))
        set_process_pipes(self._outputs.pipes())
        self._spawner.start()

    def wait(self) -> list[Any] | BaseException:
        """Pass the workers' events and what they write to their file descriptors on until
        ``xmp.spawn`` has returned; the results in rank order, or the exception to raise."""
        reader, outputs = self._reader, self._outputs
        while self._spawner.is_alive() or reader.poll(0):
            ready = wait([reader, *outputs.fds], POLL_S)
            for item in ready:
                if isinstance(item, int):
                    self._show(outputs.read(item))
            if reader in ready:
                self._events.handle(decode(reader.recv_bytes()))
            outputs.track()
            self._events.wake()
        self._show(outputs.finish())  # every worker has ended: this is all they wrote
        return self._outcome()

    def runs_left_open(self) -> list[TrackerRun]:
        """The tracker runs the ranks opened and were not heard ending."""
        return list(self._events.open_runs.values())

    def _outcome(self) -> list[Any] | BaseException:
        """The results in rank order, or the exception the kernel raises."""
        results, failures, spawner = self._events.results, self._events.failures, self._spawner
        for record in self._outputs.deaths(results, failures.ranks):
            failures.add(record)
        if failures:
            world = max(self._expected, *(rank + 1 for rank in failures.ranks), len(results))
            unfinished = [rank for rank in range(world) if rank not in results]
            return failure_outcome(failures, world, 0.0, list(results), unfinished)
        if spawner.error is not None and not isinstance(spawner.error, BrokenProcessPool):
            return spawner.error  # torch_xla itself failed (its own exception, as it raised it)
        ranks = sorted(results)
        if spawner.error is not None or spawner.exitcode or ranks != list(range(len(ranks))):
            how = f"exit code {spawner.exitcode}" if spawner.exitcode else f"{spawner.error!r}"
            how = self._outputs.unstarted() or how
            return WorkerDiedError(
                f"an XLA worker process ended without reporting ({how}); ranks that returned: "
                f"{ranks or 'none'}",
                [],
            )
        return [load_result(rank, results[rank]) for rank in ranks]

    def stop(self, graceful: bool = False) -> None:
        """Stop the workers if they still run (``xmp.spawn`` then returns), take the pipes
        back and show what the workers wrote last."""
        from ...worker.process.process_fds import set_process_pipes
        from ...worker.xla.main import set_launch_pipe

        if self._spawner.is_alive():  # interrupted: stop the workers; xmp.spawn then returns
            stop_processes(new_children(self._before))
        if self._spawner.ident is not None:
            self._spawner.join(REAP_S)
        set_launch_pipe(None)
        set_process_pipes(None)
        self._show(self._outputs.finish())  # an interrupted launch's last words
        self.printer.flush()
        self._reader.close()
        self._writer.close()
