"""The XLA lane: ``torch_xla`` on its CPU device (``PJRT_DEVICE=CPU``, one device).

The suite's ``NB_ACCEL_USE_CPU=1`` (``tests/conftest.py``) would stand for ``cpu=True`` and keep
every launch off the XLA devices: this lane's launches go without it, as on a TPU runtime.

Loading ``torch_xla`` sets a few environment variables of its own; it is loaded here, before
any test takes its snapshot of the environment. Without ``torch_xla`` every test here is
skipped (each module asks for it).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator

import pytest

if importlib.util.find_spec("torch_xla") is not None:
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    import torch_xla
    import torch_xla.distributed.xla_multiprocessing  # noqa: F401


@pytest.fixture(autouse=True)
def on_the_xla_devices(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Launches and ``Accelerator()`` take the XLA devices, not the suite's CPU."""
    monkeypatch.delenv("NB_ACCEL_USE_CPU", raising=False)
    yield
