"""What an XLA launch's workers find in their environment, besides their ranks."""

from __future__ import annotations

from ...runtime.workers.accelerate_env import accelerate_environment
from ..workers import sharding_env

__all__ = ["xla_worker_settings"]


def xla_worker_settings(precision: str, accumulation_steps: int) -> dict[str, str]:
    """The variables every worker of an XLA launch sets: nb_accel's mixed precision
    (``precision``) and gradient accumulation steps, and what makes 🤗 Accelerate's own
    ``Accelerator()`` and the 🤗 Trainer use the XLA devices with ``precision`` and no FSDP,
    whatever the kernel's environment says (the ranks' own variables come from the XLA
    runtime, in the worker)."""
    return {
        "NB_ACCEL_MIXED_PRECISION": precision,
        "NB_ACCEL_GRADIENT_ACCUMULATION_STEPS": str(accumulation_steps),
        **accelerate_environment("xla", precision),
        **sharding_env("ddp"),
    }
