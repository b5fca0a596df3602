"""The XLA (TPU) path in the workers: everything that imports ``torch_xla``.

Loading this package registers the XLA device backend (:class:`.backend.XlaBackend`) under the
name a worker of an XLA launch has in ``NB_ACCEL_BACKEND`` (``"xla"``); ``torch_xla`` itself
loads only when a state builds that backend.
"""

from __future__ import annotations

from ..device_backends.base import DeviceBackend, Rank
from ..device_backends.choice import register_device_backend


def _xla_backend(rank: Rank) -> DeviceBackend:
    from .backend import XlaBackend

    return XlaBackend(rank)


register_device_backend("xla", _xla_backend)
