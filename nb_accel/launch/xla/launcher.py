"""Launching on XLA devices (TPUs) through ``torch_xla``'s ``xmp.spawn``.

``notebook_launcher`` hands over to :func:`launch_xla` when :func:`xla_requested` says the
kernel runs on a TPU runtime; it runs an :class:`XlaLauncher`, the launcher interface's
implementation for XLA devices. The workers are forked by ``xmp.spawn`` (one process per TPU
chip, one rank per XLA device: :mod:`.tpu_plan`; :mod:`.spawner`) and report over one pipe,
with the events every launch uses, passed to the shared dispatcher: their output and progress
reach the cell as they happen, results come back in rank order, and a worker's exception is
re-raised in the kernel with its type, its traceback as the cause and its rank in a note. What
a worker process writes to its file descriptors 1 and 2 (the TPU runtime's C++ logs,
``os.write``) reaches the cell too, and explains its death (:mod:`.output`).

``torch_xla`` is imported only here, inside :func:`launch_xla`, and in the workers.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import wait
from typing import Any

from ..._messages import Output, Started, TrackerRun, decode
from ...config import load_config
from ...errors import LaunchError, WorkerDiedError
from ..launchers.dispatch import DispatchHooks, EventDispatcher
from ..launchers.interface import Launcher, run_launch
from ..launchers.outcome import failure_outcome, load_result
from ..launchers.stopping import stop_processes
from ..launchers.view import make_view
from ..payload import make_payload
from ..views.output import OutputPrinter
from .output import ProcessOutputs
from .settings import xla_worker_settings
from .spawner import Spawner, new_children
from .tpu_plan import XlaPlan, plan_xla, read_xla_facts

__all__ = ["TPU_VARIABLES", "XlaLauncher", "check_xla_matches_torch", "xla_requested", "launch_xla"]

#: Environment variables that name a TPU: set by Colab (``COLAB_TPU_ADDR``, older runtimes),
#: by Kaggle and Cloud TPU VMs (``TPU_NAME``, ``TPU_ACCELERATOR_TYPE``) and by the older XRT
#: runtime (``XRT_TPU_CONFIG``).
TPU_VARIABLES = ("COLAB_TPU_ADDR", "TPU_NAME", "TPU_ACCELERATOR_TYPE", "XRT_TPU_CONFIG")
#: How long stopped workers may take to be reaped by ``xmp.spawn`` (seconds).
REAP_S = 30.0
#: How often the watching loop looks whether ``xmp.spawn`` has returned (seconds).
POLL_S = 0.05


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


class XlaLauncher(Launcher):
    """The ranks of an XLA launch, forked by ``xmp.spawn`` (one process per TPU chip).

    The workers report over one pipe; the processes' file descriptors 1 and 2 are pipes of
    their own (:class:`~nb_accel.launch.xla.output.ProcessOutputs`).

    Args:
        xmp: ``torch_xla``'s ``xla_multiprocessing`` module.
        spawn_args: the worker's arguments (payload, settings, the kernel's pid).
        plan: the devices, processes and ranks.
        printer: writes the workers' output; its view is the launch's.
    """

    def __init__(
        self, xmp: Any, spawn_args: tuple[Any, ...], plan: XlaPlan, printer: OutputPrinter
    ) -> None:
        from ...runtime.xla.worker import run_xla_worker

        self._printer = printer
        self.view = printer.view  # the held output first at each change of state
        self._expected = plan.ranks
        self._outputs = ProcessOutputs(plan.processes, plan.threads_per_process, plan.ranks)
        self._events = EventDispatcher(
            printer, self.view, _FdFirst(self._outputs, printer), printer.flush_due
        )
        self._context = multiprocessing.get_context("fork")
        self._reader, self._writer = self._context.Pipe(duplex=False)
        self._before = {child.pid for child in multiprocessing.active_children()}
        self._spawner = Spawner(xmp, run_xla_worker, spawn_args, plan.spawn_nprocs)

    def _show(self, events: list[Output]) -> None:
        for event in events:
            self._printer(event)

    def start(self) -> None:
        """Hand the workers their pipes, and run ``xmp.spawn`` in its thread."""
        from ...runtime.workers.process_fds import set_process_pipes
        from ...runtime.xla.worker import SharedWriter, set_launch_pipe

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
        from ...runtime.workers.process_fds import set_process_pipes
        from ...runtime.xla.worker import set_launch_pipe

        if self._spawner.is_alive():  # interrupted: stop the workers; xmp.spawn then returns
            stop_processes(new_children(self._before))
        if self._spawner.ident is not None:
            self._spawner.join(REAP_S)
        set_launch_pipe(None)
        set_process_pipes(None)
        self._show(self._outputs.finish())  # an interrupted launch's last words
        self._printer.flush()
        self._reader.close()
        self._writer.close()


def _describe(plan: XlaPlan, mixed_precision: str) -> str:
    extras = "fork" + (f", {mixed_precision} mixed precision" if mixed_precision != "no" else "")
    return f"Launching {plan.describe()} (xla: xmp.spawn; {extras})"


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
    log_line_prefix_template: str | None = None,
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
        log_line_prefix_template: the prefix of each worker line instead of the rank's
            (``${rank}``, ``${local_rank}``, ``${role_name}``).

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
    payload = make_payload(function, args, kwargs or {}).seal(None)
    settings = xla_worker_settings(precision, config.gradient_accumulation_steps)
    title = _describe(plan, precision)
    view = make_view(title, count, show_progress, all_ranks_metrics, always_print_title=True)
    printer = OutputPrinter(count, prefix_output, view=view, template=log_line_prefix_template)
    spawn_args = (payload, settings, os.getpid())
    outcome = run_launch(XlaLauncher(xmp, spawn_args, plan, printer))
    if isinstance(outcome, BaseException):
        raise outcome  # the worker's exception; its worker-side traceback is its __cause__
    return outcome
