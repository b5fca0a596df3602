"""🤗 Transformers' ``Trainer`` in a worker, as written for ``accelerate launch``.

The Trainer builds its Accelerate state from what the worker set (see
:mod:`~nb_accel.runtime.workers.accelerate_env`), so it joins the launch on its own. What it
shows needs two changes, made in the worker's process only, when ``transformers.trainer`` is
loaded there (by the launched function, or before the launch in the kernel a worker was forked
from; see :mod:`~nb_accel.runtime.workers.import_hooks`):

- its default callbacks gain one whose ``on_log`` hands what the Trainer logs (``loss``,
  ``grad_norm``, ``learning_rate``, ``eval_*``...) on the main process to the live chart, as
  ``accelerator.log`` does, at the Trainer's global step. The end-of-run speed summary
  (``*_runtime``, ``*_per_second``), ``total_flos`` and ``epoch`` are not charted;
- the notebook's HTML progress (which ``transformers.trainer`` picks when it is imported in a
  Jupyter kernel, and which a worker cannot display) gives way to its tqdm progress, whose
  bars become rows of the launch view (:mod:`~nb_accel.runtime.reporting.foreign_bars`).

Nothing here imports Transformers: without it, a worker only leaves a finder waiting.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from ..tracking.live_chart import LiveChartTracker
from .import_hooks import when_imported

__all__ = ["support_trainer", "charted_logs", "CALLBACK_NAME"]

#: The module that holds the Trainer and its default callbacks.
TRAINER_MODULE = "transformers.trainer"
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


def support_trainer() -> None:
    """Adapt ``transformers.trainer`` to the launch in this worker, now or when it is loaded
    (never in the kernel: its Trainer is left as it is)."""
    when_imported(TRAINER_MODULE, _adapt_trainer)
