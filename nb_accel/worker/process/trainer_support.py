"""🤗 Transformers' ``Trainer`` in a worker, as written for ``accelerate launch``.

The Trainer builds its Accelerate state from what the worker set (see
:mod:`~nb_accel.worker.process.accelerate_env`), so it joins the launch on its own. What it
shows needs two changes, made in the worker's process only, when ``transformers.trainer`` is
loaded there (by the launched function, or before the launch in the kernel a worker was forked
from; see :mod:`~nb_accel.worker.process.import_hooks`):

- its default callbacks gain one whose ``on_log`` hands what the Trainer logs (``loss``,
  ``grad_norm``, ``learning_rate``, ``eval_*``...) on the main process to the live chart, as
  ``accelerator.log`` does, at the Trainer's global step. The end-of-run speed summary
  (``*_runtime``, ``*_per_second``), ``total_flos`` and ``epoch`` are not charted;
- the notebook's HTML progress (which ``transformers.trainer`` picks when it is imported in a
  Jupyter kernel, and which a worker cannot display) gives way to its tqdm progress, whose
  bars become rows of the launch view (:mod:`~nb_accel.worker.reporting.foreign_bars`).

``TrainingArguments`` made in the kernel and passed to the launched function set up their
devices there: one process, the kernel's device. Unpickled in a worker (once
``transformers.training_args`` is adapted there), or inherited by a forked worker as an argument,
a global or a closure's variable of the launched function, they drop that setup and make it
again in the worker, once its process group exists (:func:`set_up_training_arguments`), as if
they had been made in the launched function; a precision they do not set themselves
(``fp16``/``bf16``) is the launch's.

Nothing here imports Transformers: without it, a worker only leaves a finder waiting.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from types import CodeType, ModuleType
from typing import Any

import torch.distributed as dist

from ...runtime.device_backends.choice import named_device_backend
from ...runtime.tracking.live_chart import LiveChartTracker
from .import_hooks import when_imported

__all__ = [
    "support_trainer",
    "set_up_training_arguments",
    "reached_by",
    "charted_logs",
    "CALLBACK_NAME",
]

#: The module that holds the Trainer and its default callbacks.
TRAINER_MODULE = "transformers.trainer"
#: The module that holds ``TrainingArguments``.
ARGUMENTS_MODULE = "transformers.training_args"
#: What ``TrainingArguments`` keep of the process that set up their devices.
_DEVICE_STATE = ("_setup_devices", "_n_gpu", "distributed_state")
#: Name of the callback class added to the Trainer's defaults.
CALLBACK_NAME = "LiveChartCallback"
#: Logged names left out of the chart, and endings of names left out.
_NOT_CHARTED = frozenset({"epoch", "total_flos"})
_NOT_CHARTED_ENDINGS = ("_runtime", "_per_second")
#: The module of the Trainer's notebook progress callback.
_NOTEBOOK_PROGRESS = "transformers.utils.notebook"


def charted_logs(logs: dict[str, Any]) -> dict[str, Any]:
    """The entries of a Trainer log that the live chart draws."""
    return {
        name: value
        for name, value in logs.items()
        if name not in _NOT_CHARTED and not name.endswith(_NOT_CHARTED_ENDINGS)
    }


def _on_log(
    self: Any, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any
) -> None:
    """Chart what the Trainer logged (the main process's values: they are the launch's)."""
    if logs and getattr(state, "is_world_process_zero", True):
        LiveChartTracker().log(charted_logs(logs), step=getattr(state, "global_step", None))


def _chart_callback(base: type) -> type:
    """A ``TrainerCallback`` (``base``) that charts the Trainer's logs."""
    return type(
        CALLBACK_NAME,
        (base,),
        {
            "__doc__": "Hands what the Trainer logs to the launch view's live chart.",
            "__module__": __name__,
            "on_log": _on_log,
        },
    )


def _adapt_trainer(trainer: ModuleType) -> None:
    """Add the chart's callback to the Trainer's defaults; put the tqdm progress back in place
    of the notebook's."""
    callbacks = importlib.import_module("transformers.trainer_callback")  # loaded with it
    defaults = trainer.DEFAULT_CALLBACKS
    if not any(getattr(c, "__name__", "") == CALLBACK_NAME for c in defaults):
        defaults.append(_chart_callback(callbacks.TrainerCallback))
    progress = getattr(trainer, "DEFAULT_PROGRESS_CALLBACK", None)
    if getattr(progress, "__module__", "") == _NOTEBOOK_PROGRESS:
        setattr(trainer, "DEFAULT_PROGRESS_CALLBACK", callbacks.ProgressCallback)  # noqa: B010


#: Unpickled ``TrainingArguments`` whose devices are set up once the process group exists.
_waiting: list[Any] = []


def _describes_this_rank(state: dict[str, Any]) -> bool:
    """Whether the device setup in ``state`` is this rank's (a copy made in this worker)."""
    setup = state.get("distributed_state")
    return getattr(setup, "num_processes", None) == int(
        os.environ.get("WORLD_SIZE", "1")
    ) and getattr(setup, "process_index", None) == int(os.environ.get("RANK", "0"))


def _group_ready() -> bool:
    """Whether this rank's process group is up (a device backend of its own runs it, or
    torch.distributed's is initialised)."""
    return named_device_backend() is not None or (dist.is_available() and dist.is_initialized())


def _set_up(arguments: Any) -> None:
    arguments._setup_devices  # noqa: B018 - Transformers' own setup, run on first read


def _forget_kernel_setup(arguments: Any) -> bool:
    """Make ``arguments``, set up in another process, forget that setup (their precision the
    launch's unless they set one); False when there is none to forget."""
    state = vars(arguments)
    if "_setup_devices" not in state or _describes_this_rank(state):
        return False
    for name in _DEVICE_STATE:
        state.pop(name, None)
    if "mixed_precision" in state and not (state.get("fp16") or state.get("bf16")):
        arguments.mixed_precision = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    return True


def _setstate(self: Any, state: dict[str, Any]) -> None:
    """Restore unpickled ``TrainingArguments``; those set up in another process (the kernel)
    forget that setup and make it again in this worker."""
    self.__dict__.update(state)
    if not _forget_kernel_setup(self):
        return
    if _group_ready():
        _set_up(self)
    else:
        _waiting.append(self)


def _adapt_training_args(module: ModuleType) -> None:
    """Give ``TrainingArguments`` (and its subclasses) the :func:`_setstate` above; warn where
    their device setup is not the cached ``_setup_devices`` it forgets."""
    arguments = module.TrainingArguments
    setup = inspect.getattr_static(arguments, "_setup_devices", None)
    if not isinstance(setup, functools.cached_property):
        version = getattr(sys.modules.get("transformers"), "__version__", "?")
        warnings.warn(
            f"transformers {version}'s TrainingArguments keep no _setup_devices for nb_accel to "
            "reset: TrainingArguments made in the kernel keep the kernel's device setup in the "
            "workers; make them inside the launched function",
            stacklevel=2,
        )
    if "__setstate__" not in vars(arguments):  # one of its own is left alone
        arguments.__setstate__ = _setstate


def reached_by(
    function: Callable[..., Any], args: Iterable[Any], kwargs: dict[str, Any]
) -> Iterator[Any]:
    """What the launched call reaches at its top: its arguments, the globals its code names
    (its nested functions' too) and its closure's variables."""
    yield from args
    yield from kwargs.values()
    code = getattr(function, "__code__", None)
    names: set[str] = set()
    stack = [code] if isinstance(code, CodeType) else []
    while stack:
        current = stack.pop()
        names.update(current.co_names)
        stack.extend(c for c in current.co_consts if isinstance(c, CodeType))
    namespace = getattr(function, "__globals__", {})
    yield from (namespace[name] for name in sorted(names) if name in namespace)
    for cell in getattr(function, "__closure__", None) or ():
        try:
            yield cell.cell_contents
        except ValueError:  # an empty cell
            continue


def set_up_training_arguments(reached: Iterable[Any] = ()) -> None:
    """Set up, in this worker, the devices of the ``TrainingArguments`` unpickled before its
    process group existed, and of those among ``reached`` (what the launched call reaches:
    :func:`reached_by`) set up in another process (the kernel a forked worker inherited them
    from): call it once the group exists."""
    while _waiting:
        _set_up(_waiting.pop(0))
    module = sys.modules.get(ARGUMENTS_MODULE)
    if module is None:
        return
    for value in reached:
        if isinstance(value, module.TrainingArguments) and _forget_kernel_setup(value):
            _set_up(value)


def support_trainer() -> None:
    """Adapt ``transformers.trainer`` and ``transformers.training_args`` to the launch in this
    worker, now or when they are loaded (never in the kernel: its Trainer is left as it is)."""
    when_imported(TRAINER_MODULE, _adapt_trainer)
    when_imported(ARGUMENTS_MODULE, _adapt_training_args)
