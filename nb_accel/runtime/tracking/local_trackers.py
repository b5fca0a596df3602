"""Trackers that keep their runs in local folders: Aim (a repository) and DVCLive. Each
imports its library only when its run starts."""

from __future__ import annotations

import os
import warnings
from typing import Any

from .base import GeneralTracker, on_main_process, plain_values

__all__ = ["AimTracker", "DVCLiveTracker"]


class AimTracker(GeneralTracker):
    """Logs to an Aim run in the repository at ``logging_dir`` (``aim.Run(repo=...)``).

    Args:
        run_name: the run's name.
        logging_dir: the Aim repository (the Accelerator's ``logging_dir``).
        kwargs: passed on to ``aim.Run``.
    """

    name = "aim"
    requires_logging_directory = True

    def __init__(
        self, run_name: str, logging_dir: str | os.PathLike[str] | None = ".", **kwargs: Any
    ) -> None:
        super().__init__()
        self.run_name = run_name
        self.aim_repo_path = logging_dir
        self.init_kwargs = kwargs
        self.writer: Any = None

    @on_main_process
    def start(self) -> None:
        """Open the run."""
        from aim import Run

        self.writer = Run(repo=self.aim_repo_path, **self.init_kwargs)
        self.writer.name = self.run_name

    @property
    def tracker(self) -> Any:
        """The ``aim.Run``."""
        return self.writer

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Store ``values`` as the run's ``hparams``."""
        self.writer["hparams"] = plain_values(values)

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Track each value under its name at ``step``."""
        for key, value in plain_values(values).items():
            self.writer.track(value, name=key, step=step, **kwargs)

    @on_main_process
    def log_images(
        self,
        values: dict[str, Any],
        step: int | None = None,
        kwargs: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        """Each value an image, or ``(image, caption)``; ``kwargs`` may hold options for
        ``aim.Image`` (``"aim_image"``) and for ``Run.track`` (``"track"``)."""
        import aim

        options = kwargs or {}
        for key, value in values.items():
            image, caption = value if isinstance(value, tuple) else (value, "")
            picture = aim.Image(image, caption=caption, **options.get("aim_image", {}))
            self.writer.track(picture, name=key, step=step, **options.get("track", {}))

    @on_main_process
    def finish(self) -> None:
        """Close the run."""
        if self.writer is not None:
            writer, self.writer = self.writer, None
            writer.close()


class DVCLiveTracker(GeneralTracker):
    """Logs with ``dvclive.Live`` (``init_kwargs={"dvclive": {"dir": ...}}`` chooses its
    folder).

    Args:
        run_name: not used by DVCLive.
        live: a ``Live`` of your own to log to.
        kwargs: passed on to ``dvclive.Live``.
    """

    name = "dvclive"
    requires_logging_directory = False

    def __init__(self, run_name: str | None = None, live: Any = None, **kwargs: Any) -> None:
        super().__init__()
        self.live = live
        self.init_kwargs = kwargs
        self._warned: set[str] = set()

    @on_main_process
    def start(self) -> None:
        """Create the ``Live`` (unless one was given)."""
        from dvclive import Live

        if self.live is None:
            self.live = Live(**self.init_kwargs)

    @property
    def tracker(self) -> Any:
        """The ``dvclive.Live``."""
        return self.live

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Log ``values`` as params."""
        self.live.log_params(plain_values(values))

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Log what DVCLive takes as metrics at ``step``, then move to the next step."""
        from dvclive.plots import Metric

        if step is not None:
            self.live.step = step
        for key, value in plain_values(values).items():
            if Metric.could_log(value):
                self.live.log_metric(key, value, **kwargs)
            elif key not in self._warned:
                self._warned.add(key)
                warnings.warn(f"DVCLive cannot log {key!r} ({type(value).__name__})", stacklevel=3)
        self.live.next_step()

    @on_main_process
    def finish(self) -> None:
        """End the ``Live``."""
        if self.live is not None:
            self.live.end()
