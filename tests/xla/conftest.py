"""The XLA lane: ``torch_xla`` on its CPU device (``PJRT_DEVICE=CPU``, one device).

Loading ``torch_xla`` sets a few environment variables of its own; it is loaded here, before
any test takes its snapshot of the environment. Without ``torch_xla`` every test here is
skipped (each module asks for it).
"""

from __future__ import annotations

import importlib.util
import os

if importlib.util.find_spec("torch_xla") is not None:
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    import torch_xla
    import torch_xla.distributed.xla_multiprocessing  # noqa: F401
