"""The shape trackers share whose library starts a run with ``init(project=...)``: Weights &
Biases, trackio and SwanLab (the library is imported only when the run starts)."""

from __future__ import annotations

from typing import Any

from .base import GeneralTracker, on_main_process, plain_values

__all__ = ["InitRunTracker"]


class InitRunTracker(GeneralTracker):
    """A tracker of a library with ``init(project=...)`` returning a run with ``log`` and
    ``finish``, and a module-level ``config`` and ``Image`` (W&B's shape, which trackio and
    SwanLab share).

    A subclass names the library's module in ``_module``.

    Args:
        run_name: the project (the ``project_name`` of ``init_trackers``).
        kwargs: passed on to the library's ``init``.
    """

    requires_logging_directory = False
    _module = ""

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.run: Any = None

    def _library(self) -> Any:
        """The library's module, imported now."""
        return __import__(self._module)

    @on_main_process
    def start(self) -> None:
        """Start the run."""
        self.run = self._library().init(project=self.run_name, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        """The library's run."""
        return self.run

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Put ``values`` in the run's config."""
        self._library().config.update(plain_values(values), allow_val_change=True)

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """``run.log(values, step=step, **kwargs)``, tensors read first."""
        self.run.log(plain_values(values), step=step, **kwargs)

    @on_main_process
    def log_images(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Each value a list of images (arrays or PIL images), logged as the library's
        ``Image``s."""
        library = self._library()
        for key, images in values.items():
            self.run.log({key: [library.Image(image) for image in images]}, step=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        """Finish the run."""
        if self.run is not None:
            run, self.run = self.run, None
            run.finish()
