"""What 🤗 Accelerate reads in a worker, so that its own ``Accelerator()`` joins the launch.

Accelerate's ``PartialState`` decides from the environment: ``LOCAL_RANK`` (set by every worker,
as torchrun does) makes it distributed, ``ACCELERATE_USE_CPU`` makes that ``MULTI_CPU`` with gloo
rather than a GPU (or XLA) backend, ``ACCELERATE_MIXED_PRECISION`` is its default precision (the
🤗 Trainer's too, unless its ``fp16``/``bf16`` arguments say otherwise), and
``OMP_NUM_THREADS`` unset makes it pick a thread count of its own. Since the worker's process
group exists already, Accelerate uses it rather than creating one; its device is
``cuda:LOCAL_RANK`` on a GPU launch, the rank's XLA device on XLA, the CPU otherwise. The
🤗 Trainer reads the same variables (``ACCELERATE_USE_CPU`` stands for its ``use_cpu=True``).

Nothing here imports Accelerate: a worker only sets variables, and forgets a state a forked
worker inherited from a kernel that had already made an ``accelerate.Accelerator``.
"""

from __future__ import annotations

import sys

from ...runtime.device_types import DeviceType

__all__ = ["accelerate_environment", "forget_accelerate_state"]


def accelerate_environment(device: DeviceType, mixed_precision: str) -> dict[str, str]:
    """The variables that make Accelerate's own state match a launch on ``device`` with
    ``mixed_precision`` (``"no"``, ``"fp16"``, ``"bf16"``).

    Both are set either way, so that a value left in the kernel's environment by an earlier
    experiment cannot contradict the launch (on XLA, ``ACCELERATE_USE_CPU=true`` would make
    Accelerate pass over the XLA devices).
    """
    return {**device.accelerate_env(), "ACCELERATE_MIXED_PRECISION": mixed_precision}


def forget_accelerate_state() -> None:
    """Clear Accelerate's shared states if Accelerate is loaded (a worker forked from a kernel
    that made an ``accelerate.Accelerator`` inherits them, built for one process): its next
    ``Accelerator()`` is then built from this worker's environment and process group."""
    module = sys.modules.get("accelerate.state")
    if module is None:
        return
    for name in ("AcceleratorState", "PartialState", "GradientState"):
        shared = getattr(getattr(module, name, None), "_shared_state", None)
        if isinstance(shared, dict):
            shared.clear()
