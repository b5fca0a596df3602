"""Launching on XLA devices (TPUs) through ``torch_xla``'s ``xmp.spawn``.

``notebook_launcher`` hands over to :func:`launch_xla` when :func:`xla_requested` says the
kernel runs on a TPU runtime. The workers are forked by ``xmp.spawn`` (one process per TPU
chip, one rank per XLA device: :mod:`.tpu_plan`) and report over one pipe, with the events
every launch uses: their output and progress reach the cell as they happen, results come back
in rank order, and a worker's exception is re-raised in the kernel with its type, its traceback
as the cause and its rank in a note. What a worker process writes to its file descriptors 1 and 2
(the TPU runtime's C++ logs, ``os.write``) reaches the cell too, and explains its death
(:mod:`.xla_output`).

``torch_xla`` is imported only here, inside :func:`launch_xla`, and in the workers.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import wait
from typing import Any

from ..._messages import Event, Failure, Output, Report, Result, Started, decode
from ...config import load_config
from ...errors import LaunchError, WorkerDiedError
from ..failures.failure_log import FailureLog
from ..payload import make_payload
from ..views.output import OutputPrinter
from ..views.text_view import TextView
from ..views.view import LaunchView, NullView, view_factory
from .output import ProcessOutputs
from .settings import xla_worker_settings
from .tpu_plan import XlaPlan, plan_xla, read_xla_facts

__all__ = ["TPU_VARIABLES", "check_xla_matches_torch", "xla_requested", "launch_xla"]

#: Environment variables that name a TPU: set by Colab (``COLAB_TPU_ADDR``, older runtimes),
#: by Kaggle and Cloud TPU VMs (``TPU_NAME``, ``TPU_ACCELERATOR_TYPE``) and by the older XRT
#: runtime (``XRT_TPU_CONFIG``).
TPU_VARIABLES = ("COLAB_TPU_ADDR", "TPU_NAME", "TPU_ACCELERATOR_TYPE", "XRT_TPU_CONFIG")
#: How long stopped workers get between SIGTERM and SIGKILL (seconds).
STOP_GRACE_S = 1.0
#: How often the launch view is ticked (seconds).
TICK_S = 1.0
#: How long stopped workers may take to be reaped by ``xmp.spawn`` (seconds).
REAP_S = 30.0


def _xla_reason() -> str | None:
    """The environment variable that asks for XLA, as ``NAME=value``, or ``None``."""
    for name in ("PJRT_DEVICE", *TPU_VARIABLES):
        value = os.environ.get(name, "")
        if value:
            return f"{name}={value}"
    return None


def xla_requested() -> bool:
    """True when launches should run on XLA devices through ``torch_xla``.

    That is when ``PJRT_DEVICE`` is set to anything (``TPU``; ``CPU`` or ``CUDA`` only when you
    set it yourself, which asks for XLA on those devices), or when one of
    :data:`TPU_VARIABLES` names a TPU. Empty values count as unset. Only the environment is
    read: nothing is imported.
    """
    return _xla_reason() is not None


def _import_xla() -> Any:
    """``torch_xla``'s ``xla_multiprocessing`` module, or a :class:`LaunchError` saying how
    to install it."""
    try:
        import torch_xla  # registers the XLA device with torch
        import torch_xla.distributed.xla_multiprocessing as xmp
    except ImportError as error:
        import torch

        reason = _xla_reason()
        where = (
            f"this is a TPU runtime ({reason}), and launching on it"
            if reason
            else "launching on XLA devices"
        )
        version = torch.__version__.split("+")[0]
        raise LaunchError(
            f"{where} needs torch_xla, which is not installed: "
            f'pip install "nb-accel[xla]" "torch_xla=={version}" (the version of your torch), '
            "then restart the kernel; or pass cpu=True to launch on the CPU instead "
            f"({type(error).__name__}: {error})"
        ) from error
    import torch

    check_xla_matches_torch(torch.__version__, getattr(torch_xla, "__version__", ""))
    return xmp


def _release(version: str) -> tuple[str, ...]:
    return tuple(version.split("+")[0].split(".")[:2])


def check_xla_matches_torch(torch_version: str, xla_version: str) -> None:
    """Refuse a torch_xla built for another torch release (``2.9`` against ``2.13``): its
    extension would fail to load or crash in the workers. An unknown version passes."""
    if not xla_version or _release(xla_version) == _release(torch_version):
        return
    wanted = ".".join(_release(torch_version))
    raise LaunchError(
        f"torch_xla {xla_version} is built for torch {'.'.join(_release(xla_version))}, but "
        f"this kernel has torch {torch_version}: install the matching pair, e.g. "
        f'pip install "torch_xla=={wanted}.*" (or torch of torch_xla\'s release), then '
        "restart the kernel"
    )


def _check_kernel_is_clean() -> None:
    import torch_xla

    if torch_xla._XLAC._xla_runtime_is_initialized():
        raise LaunchError(
            "the XLA device is already in use in this kernel, so the workers cannot have it. "
            "Restart the kernel and keep every XLA call (torch_xla.device(), .to('xla'), ...) "
            "inside the launched function."
        )


def _check_options(num_processes: object, mixed_precision: str, start_method: str | None) -> None:
    """``TypeError``/``ValueError`` for options an XLA launch cannot honour."""
    if num_processes is not None and (
        isinstance(num_processes, bool) or not isinstance(num_processes, int)
    ):
        raise TypeError(f"num_processes must be a positive int, got {num_processes!r}")
    if num_processes is not None and num_processes < 1:
        raise ValueError(f"num_processes must be a positive int (1 or more), got {num_processes}")
    if mixed_precision not in ("no", "bf16"):
        raise ValueError(
            f"mixed_precision={mixed_precision!r} is not available on XLA devices; "
            "use 'bf16' or 'no'"
        )
    if start_method not in (None, "fork"):
        raise ValueError(
            f"start_method={start_method!r}: an XLA launch forks its workers (xmp.spawn with "
            "start_method='fork'); leave start_method out"
        )


class _Watch:
    """What the workers reported: output and progress passed on as they come, results and
    failures kept; what the worker processes wrote to their file descriptors 1 and 2 is
    shown before a change of a rank's state."""

    def __init__(self, printer: OutputPrinter, view: LaunchView, outputs: ProcessOutputs) -> None:
        self.printer = printer
        self.view = view
        self.outputs = outputs
        self.results: dict[int, bytes] = {}
        self.failures = FailureLog(view)

    def show(self, events: list[Output]) -> None:
        """Pass on what the worker processes wrote to their file descriptors."""
        for event in events:
            self.printer(event)

    def handle(self, event: Event) -> None:
        """Act on one event from a worker."""
        if not isinstance(event, (Output, Report)):
            self.show(self.outputs.read_all())
        if isinstance(event, Output):
            self.printer(event)
        elif isinstance(event, Report):
            self.view.report(event)
        elif isinstance(event, Started):
            self.outputs.started(event.rank, event.pid)
            self.view.started(event.rank, event.pid)
        elif isinstance(event, Result):
            self.results[event.rank] = event.data
            self.view.returned(event.rank)
        elif isinstance(event, Failure):
            self.failures.add_event(event)


class _Spawner(threading.Thread):
    """Runs ``xmp.spawn`` off the kernel's main thread, which watches the workers meanwhile.

    With one process, ``xmp.spawn(nprocs=1)`` would run the function in the calling process,
    so it runs in a child forked here instead: the kernel never touches the XLA device.
    """

    def __init__(
        self, xmp: Any, target: Callable[..., None], args: tuple[Any, ...], nprocs: int | None
    ) -> None:
        super().__init__(name="nb_accel-xla-spawn", daemon=True)
        self._xmp = xmp
        self._target = target
        self._args = args
        self._nprocs = nprocs
        self.error: BaseException | None = None
        self.exitcode: int | None = None

    def run(self) -> None:
        """Spawn the workers and wait for them; keep what went wrong for the kernel."""
        try:
            if self._nprocs == 1:
                child = multiprocessing.get_context("fork").Process(
                    target=_spawn_one,
                    args=(self._xmp, self._target, self._args),
                    name="nb_accel-xla-worker",
                )
                child.start()
                child.join()
                self.exitcode = child.exitcode
            else:
                self._xmp.spawn(self._target, args=self._args, start_method="fork")
        except BaseException as error:  # noqa: BLE001 - examined by the launching thread
            self.error = error


def _spawn_one(xmp: Any, target: Callable[..., None], args: tuple[Any, ...]) -> None:
    xmp.spawn(target, args=args, nprocs=1, start_method="fork")


def _stop(children: Sequence[multiprocessing.process.BaseProcess]) -> None:
    """SIGTERM every worker (and what it started), a short grace, then SIGKILL."""
    for sig, grace in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 0.0)):
        for child in children:
            if child.pid is not None and child.exitcode is None:
                try:
                    os.killpg(child.pid, sig)
                except OSError:
                    try:
                        os.kill(child.pid, sig)
                    except OSError:
                        pass
        deadline = time.monotonic() + grace
        while any(c.is_alive() for c in children) and time.monotonic() < deadline:
            time.sleep(0.02)


def _watch(reader: Any, spawner: _Spawner, watch: _Watch) -> None:
    """Pass the workers' events and what they write to their file descriptors on until
    ``xmp.spawn`` has returned and the event pipe is empty."""
    next_tick = time.monotonic() + TICK_S
    outputs = watch.outputs
    while spawner.is_alive() or reader.poll(0):
        ready = wait([reader, *outputs.fds], 0.05)
        for item in ready:
            if isinstance(item, int):
                watch.show(outputs.read(item))
        if reader in ready:
            watch.handle(decode(reader.recv_bytes()))
        outputs.track()
        watch.printer.flush_due()
        if time.monotonic() >= next_tick:
            watch.view.tick()
            next_tick = time.monotonic() + TICK_S


def _outcome(watch: _Watch, spawner: _Spawner, expected: int) -> list[Any] | BaseException:
    """The results in rank order, or the exception the kernel raises (call once every worker
    has ended and its output is read)."""
    for record in watch.outputs.deaths(watch.results, watch.failures.ranks):
        watch.failures.add(record)
    if watch.failures:
        world = max(expected, *(rank + 1 for rank in watch.failures.ranks), len(watch.results))
        status = {rank: "had already returned" for rank in watch.results}
        watch.failures.settle(rank for rank in range(world) if rank not in watch.results)
        return watch.failures.exception(world, status, 0.0)
    if spawner.error is not None and not isinstance(spawner.error, BrokenProcessPool):
        return spawner.error  # torch_xla itself failed (its own exception, as it raised it)
    ranks = sorted(watch.results)
    if spawner.error is not None or spawner.exitcode or ranks != list(range(len(ranks))):
        how = f"exit code {spawner.exitcode}" if spawner.exitcode else f"{spawner.error!r}"
        how = watch.outputs.unstarted() or how
        return WorkerDiedError(
            f"an XLA worker process ended without reporting ({how}); ranks that returned: "
            f"{ranks or 'none'}",
            [],
        )
    return [pickle.loads(watch.results[rank]) for rank in ranks]


def _describe(plan: XlaPlan, mixed_precision: str) -> str:
    extras = "fork" + (f", {mixed_precision} mixed precision" if mixed_precision != "no" else "")
    return f"Launching {plan.describe()} (xla: xmp.spawn; {extras})"


def _make_view(title: str, count: int, show_progress: bool, all_ranks: bool) -> LaunchView:
    print(title, flush=True)
    sys.stderr.flush()
    if not show_progress:
        return NullView()
    factory = view_factory()
    view = factory(title, count, all_ranks) if factory else None
    return view if view is not None else TextView(count)


def launch_xla(
    function: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    num_processes: int | None = None,
    mixed_precision: str | None = None,
    start_method: str | None = None,
    prefix_output: bool = True,
    show_progress: bool = True,
    all_ranks_metrics: bool = False,
) -> list[Any]:
    """Run ``function(*args, **kwargs)`` on every local XLA device (or one) and wait.

    As ``xmp.spawn`` does, the workers are one process per TPU chip; a chip of TPU v2 or v3
    holds two devices (TensorCores), whose ranks run as two threads of its process
    (:mod:`.tpu_plan`).

    Options as in :func:`~nb_accel.notebook_launcher`; ``mixed_precision`` and the gradient
    accumulation steps default to the saved configuration.

    Args:
        function: what every rank runs; it travels to the workers by cloudpickle.
        args: positional arguments, the same for every rank.
        kwargs: keyword arguments for ``function``.
        num_processes: the number of ranks: ``None`` or the number of local XLA devices (one
            rank each; on TPU v2/v3 two per chip, run as two threads of the chip's process),
            or 1 (the first device).
        mixed_precision: ``"no"`` or ``"bf16"``.
        start_method: ``None`` or ``"fork"`` (the workers are always forked).
        prefix_output: prefix worker output with the rank when there is more than one.
        show_progress: show the launch view (a widget in a notebook, text elsewhere).
        all_ranks_metrics: chart every rank's logged metrics, not only rank 0's.

    Returns:
        Each rank's return value, in rank order (tensors moved to the CPU).

    Raises:
        LaunchError: ``torch_xla`` is missing, or the kernel already uses the XLA device.
        TypeError, ValueError: bad arguments (a ``num_processes`` that the devices cannot run
            says which work), before any process starts.
        Exception: a worker's own exception, as ``notebook_launcher`` raises it.
        KeyboardInterrupt: the kernel was interrupted; every worker is stopped first.
    """
    xmp = _import_xla()
    config = load_config()
    precision = str(mixed_precision or config.mixed_precision).lower()
    _check_options(num_processes, precision, start_method)
    plan = plan_xla(read_xla_facts(), num_processes)
    count = plan.ranks
    _check_kernel_is_clean()
    payload = make_payload(function, args, kwargs or {})
    settings = xla_worker_settings(precision, config.gradient_accumulation_steps)
    view = _make_view(_describe(plan, precision), count, show_progress, all_ranks_metrics)
    printer = OutputPrinter(count, prefix_output, view=view)
    outputs = ProcessOutputs(plan.processes, plan.threads_per_process, count)
    watch = _Watch(printer, printer.view, outputs)  # held output first at a change of state
    outcome = _run(xmp, (payload, settings, os.getpid()), plan.spawn_nprocs, watch, count)
    if isinstance(outcome, BaseException):
        raise outcome  # the worker's exception; its worker-side traceback is its __cause__
    return outcome


def _run(
    xmp: Any, spawn_args: tuple[Any, ...], nprocs: int | None, watch: _Watch, expected: int
) -> Any:
    from ...runtime.workers.process_fds import set_process_pipes
    from ...runtime.xla.worker import SharedWriter, run_xla_worker, set_launch_pipe

    context = multiprocessing.get_context("fork")
    reader, writer = context.Pipe(duplex=False)
    before = {child.pid for child in multiprocessing.active_children()}
    spawner = _Spawner(xmp, run_xla_worker, spawn_args, nprocs)
    succeeded = False
    try:
        set_launch_pipe(SharedWriter(writer, context.Lock()))
        set_process_pipes(watch.outputs.pipes())
        spawner.start()
        _watch(reader, spawner, watch)
        watch.show(watch.outputs.finish())  # every worker has ended: this is all they wrote
        outcome = _outcome(watch, spawner, expected)
        succeeded = not isinstance(outcome, BaseException)
        return outcome
    finally:
        watch.view.finished(succeeded)
        if spawner.is_alive():  # interrupted: stop the workers; xmp.spawn then returns
            _stop([c for c in multiprocessing.active_children() if c.pid not in before])
        if spawner.ident is not None:
            spawner.join(REAP_S)
        set_launch_pipe(None)
        set_process_pipes(None)
        watch.show(watch.outputs.finish())  # an interrupted launch's last words
        watch.printer.flush()
        reader.close()
        writer.close()
