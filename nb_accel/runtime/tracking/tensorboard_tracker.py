"""TensorBoard: event files under ``logging_dir/<project_name>`` (``torch.utils.tensorboard``)."""

from __future__ import annotations

import os
import time
from typing import Any

from .base import GeneralTracker, on_main_process, plain_values

__all__ = ["TensorBoardTracker"]

#: How often the writer's thread writes its queue to disk (seconds), unless ``flush_secs`` is
#: given: a worker that dies loses at most this much.
FLUSH_SECS = 5


class TensorBoardTracker(GeneralTracker):
    """Logs to TensorBoard event files in ``logging_dir/run_name``.

    Args:
        run_name: the run's folder inside ``logging_dir`` (the ``project_name`` of
            ``init_trackers``).
        logging_dir: where runs go (the Accelerator's ``logging_dir``).
        kwargs: passed on to ``SummaryWriter`` (``flush_secs`` defaults to 5 seconds).
    """

    name = "tensorboard"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str], **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.logging_dir_param = logging_dir
        self.logging_dir = os.path.join(os.fspath(logging_dir), run_name)
        self.init_kwargs = {"flush_secs": FLUSH_SECS, **kwargs}
        self.writer: Any = None

    @on_main_process
    def start(self) -> None:
        """Open the ``SummaryWriter``."""
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(self.logging_dir, **self.init_kwargs)

    def _where(self) -> str | None:
        """The run's folder, and how to look at it."""
        folder = os.path.abspath(self.logging_dir)
        return f"event files in {folder} (tensorboard --logdir {folder})"

    @property
    def tracker(self) -> Any:
        """The ``SummaryWriter``."""
        return self.writer

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Write ``values`` as the run's hparams, and as ``hparams.yml`` in a folder of the run
        named after the time."""
        import yaml

        values = plain_values(values)
        self.writer.add_hparams(_hparam_values(values), metric_dict={})
        self.writer.flush()
        folder = os.path.join(self.logging_dir, str(time.time()))
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "hparams.yml"), "w") as out:
            yaml.safe_dump(values, out)

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Numbers as scalars, text as text, a dict of numbers as ``add_scalars`` (one line per
        key in one chart); tensors are read first (a one-element tensor is a number)."""
        for key, value in plain_values(values).items():
            if isinstance(value, (int, float)):
                self.writer.add_scalar(key, value, global_step=step, **kwargs)
            elif isinstance(value, str):
                self.writer.add_text(key, value, global_step=step, **kwargs)
            elif isinstance(value, dict):
                self.writer.add_scalars(key, value, global_step=step, **kwargs)

    @on_main_process
    def log_images(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Each value a batch of images (``add_images``: NCHW arrays or tensors by default)."""
        for key, images in values.items():
            self.writer.add_images(key, images, global_step=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        """Write out and close every event file."""
        if self.writer is not None:
            self.writer.close()


def _hparam_values(values: dict[str, Any]) -> dict[str, Any]:
    """What ``add_hparams`` takes: numbers, text, booleans (others as text)."""
    return {
        key: value if isinstance(value, (int, float, str, bool)) else str(value)
        for key, value in values.items()
    }
