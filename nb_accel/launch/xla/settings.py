"""What an XLA launch's workers find in their environment, besides their ranks."""

from __future__ import annotations

from ...worker.process.accelerate_env import accelerate_environment
from ..plan import LaunchPlan
from ..workers import sharding_env

__all__ = ["xla_worker_settings"]


def xla_worker_settings(plan: LaunchPlan) -> dict[str, str]:
    """The variables every worker of an XLA launch sets: nb_accel's mixed precision and
    gradient accumulation steps, and what makes 🤗 Accelerate's own ``Accelerator()`` and the
    🤗 Trainer use the XLA devices with that precision and the plan's sharding, whatever the
    kernel's environment says (the ranks' own variables come from the XLA runtime, in the
    worker)."""
    return {
        "NB_ACCEL_MIXED_PRECISION": plan.mixed_precision,
        "NB_ACCEL_GRADIENT_ACCUMULATION_STEPS": str(plan.gradient_accumulation_steps),
        **accelerate_environment(plan.device, plan.mixed_precision),
        **sharding_env(plan.sharding),
    }
