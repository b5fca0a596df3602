"""Weights & Biases: one run per ``init_trackers`` (``wandb.init(project=project_name)``)."""

from __future__ import annotations

import os
from typing import Any

from .base import on_main_process, plain_values
from .init_run import InitRunTracker

__all__ = ["WandBTracker"]


class WandBTracker(InitRunTracker):
    """Logs to a Weights & Biases run (``WANDB_MODE=offline`` keeps it on disk only).

    ``log`` passes its values to ``run.log`` (nested dicts are W&B's own ``outer.inner``
    names); ``log_images`` logs each value, a list of images, as ``wandb.Image``s.

    Args:
        run_name: the W&B project (the ``project_name`` of ``init_trackers``).
        kwargs: passed on to ``wandb.init`` (``name``, ``entity``, ``mode``, ``dir``, ``tags``...).
    """

    name = "wandb"
    _module = "wandb"

    def _where(self) -> str | None:
        """The run's name, mode and folder."""
        if self.run is None:
            return None
        mode = "offline" if getattr(self.run, "offline", False) else "online"
        name = self.run.name or self.run.id
        folder = os.path.dirname(os.path.normpath(self.run.dir))
        return f"run {name!r} of project {self.run_name!r} ({mode}) in {folder}"

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Put ``values`` in the run's config."""
        self.run.config.update(plain_values(values), allow_val_change=True)

    @on_main_process
    def log_table(
        self,
        table_name: str,
        columns: list[str] | None = None,
        data: list[list[Any]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
        **kwargs: Any,
    ) -> None:
        """Log a ``wandb.Table`` from ``columns`` and ``data``, or from a ``dataframe``."""
        import wandb

        table = wandb.Table(
            columns=list(columns) if columns else None, data=data, dataframe=dataframe
        )
        self.run.log({table_name: table}, step=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        """Finish the run and, with no run left in the process, stop W&B's service process."""
        self._end(exit_code=None)

    def _finish_after_failure(self) -> None:
        """Finish the run marked as failed."""
        self._end(exit_code=1)

    def _end(self, exit_code: int | None) -> None:
        if self.run is None:
            return
        import wandb

        run, self.run = self.run, None
        if exit_code is None:
            run.finish()
        else:
            run.finish(exit_code=exit_code)
        if wandb.run is None:
            wandb.teardown()
