"""The Accelerator's profiler: ``accelerator.profile()`` around ``torch.profiler.profile``."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from ..options import ProfileKwargs
from ..state import PartialState

__all__ = ["ProfilingMethods"]


class ProfilingMethods:
    """Mixin of :class:`Accelerator`: profiling a block of the training loop."""

    _handlers: dict[str, Any]
    _partial: PartialState

    @property
    def profile_handler(self) -> ProfileKwargs | None:
        """The :class:`ProfileKwargs` passed in ``kwargs_handlers``, or None."""
        handler = self._handlers.get(ProfileKwargs.__name__)
        return handler if isinstance(handler, ProfileKwargs) else None

    @contextlib.contextmanager
    def profile(self, profile_handler: ProfileKwargs | None = None) -> Iterator[Any]:
        """Profile the block inside ``with accelerator.profile() as prof:``.

        ``prof`` is the running ``torch.profiler.profile`` (``prof.key_averages().table()``,
        ``prof.step()`` with a schedule). Its options come from ``profile_handler``, else from the
        :class:`ProfileKwargs` given to the Accelerator, else torch's defaults. With
        ``output_trace_dir`` set, each process writes its Chrome trace there as
        ``profile_<process index>.json`` and waits for the others when the block ends.
        """
        handler = profile_handler or self.profile_handler or ProfileKwargs()
        with handler.build() as profiler:
            yield profiler
        if handler.output_trace_dir is None:
            return
        os.makedirs(handler.output_trace_dir, exist_ok=True)
        name = f"profile_{self._partial.process_index}.json"
        profiler.export_chrome_trace(os.path.join(handler.output_trace_dir, name))
        self._partial.wait_for_everyone()
