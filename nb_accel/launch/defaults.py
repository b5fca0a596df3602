"""A launch's options: the arguments given, else the saved configuration, else built-ins."""

from __future__ import annotations

from ..config import config_path, load_config
from ..errors import LaunchError
from .plan import LaunchPlan, make_plan

__all__ = ["plan_with_defaults"]


def plan_with_defaults(
    num_processes: object,
    mixed_precision: object,
    start_method: str | None,
    timeout: object,
    cpu: bool | None,
) -> LaunchPlan:
    """The launch plan; every option left as ``None`` takes the saved configuration's value
    (:func:`~nb_accel.config.load_config`). A malformed configuration file is an error
    naming the file, raised before any process starts."""
    config = load_config()
    if config.num_nodes > 1:
        raise LaunchError(
            f"the saved configuration ({config_path()}) asks for num_nodes={config.num_nodes}; "
            "multi-node launches are not available in this version: set num_nodes to 1"
        )
    return make_plan(
        config.num_processes if num_processes is None else num_processes,
        config.mixed_precision if mixed_precision is None else mixed_precision,
        config.start_method if start_method is None else start_method,
        config.timeout if timeout is None else timeout,
        config.cpu if cpu is None else cpu,
        config.gradient_accumulation_steps,
    )
