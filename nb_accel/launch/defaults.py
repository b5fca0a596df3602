"""A launch's options: the arguments given, else the saved configuration, else built-ins."""

from __future__ import annotations

import os

from ..config import Config, config_path, load_config
from ..errors import LaunchError
from .multinode.nodes import (
    NODE_FIELDS,
    NodePlan,
    check_rdzv_conf,
    make_node_plan,
    pop_join_timeout,
)
from .plan import LaunchPlan, make_plan, sharding_for

__all__ = ["CPU_VARIABLE", "plan_with_defaults", "node_plan_with_defaults"]

#: Set to ``1`` in the environment, the launch runs on the CPU unless ``cpu`` is given
#: (the workers see it too, and an ``Accelerator`` made outside a launch stays on the CPU).
CPU_VARIABLE = "NB_ACCEL_USE_CPU"


def plan_with_defaults(
    num_processes: object,
    mixed_precision: object,
    start_method: str | None,
    timeout: object,
    cpu: bool | None,
    config: Config | None = None,
    single_node: bool = True,
    fsdp: object = None,
) -> LaunchPlan:
    """The launch plan; every option left as ``None`` takes the saved configuration's value
    (:func:`~nb_accel.config.load_config`, or ``config`` when given). A malformed
    configuration file is an error naming the file, raised before any process starts.
    ``NB_ACCEL_USE_CPU=1`` in the environment stands for ``cpu=True`` when ``cpu`` is not given.
    ``fsdp`` (True, False or None) picks the sharding: FSDP, DDP, or the saved ``sharding``.

    With ``single_node`` (persistent workers), a saved ``num_nodes > 1`` is refused with a
    message saying so.
    """
    config = load_config() if config is None else config
    if cpu is None and os.environ.get(CPU_VARIABLE) == "1":
        cpu = True
    if single_node and config.num_nodes > 1:
        raise LaunchError(
            f"the saved configuration ({config_path()}) asks for num_nodes={config.num_nodes}, "
            "but persistent %%distributed workers run on this machine only: set num_nodes to 1 "
            "for them (notebook_launcher runs on several nodes)"
        )
    return make_plan(
        config.num_processes if num_processes is None else num_processes,
        config.mixed_precision if mixed_precision is None else mixed_precision,
        config.start_method if start_method is None else start_method,
        config.timeout if timeout is None else timeout,
        config.cpu if cpu is None else cpu,
        config.gradient_accumulation_steps,
        sharding_for(fsdp, config.sharding),
    )


#: Accelerate's default ``rdzv_backend``, taken as c10d (see :func:`node_plan_with_defaults`).
STATIC_BACKEND = "static"


def node_plan_with_defaults(
    config: Config,
    num_nodes: object,
    node_rank: object,
    rdzv_endpoint: object,
    rdzv_backend: object,
    max_restarts: object,
    rdzv_timeout: object,
    *,
    rdzv_conf: object = None,
    rdzv_id: object = None,
    monitor_interval: object = None,
) -> NodePlan:
    """The launch's nodes; every option left as ``None`` takes ``config``'s value. A
    ``join_timeout`` in ``rdzv_conf`` is ``rdzv_timeout`` given (it wins over the saved one).
    Accelerate's default backend, ``"static"`` (a fixed set of nodes, ranks by ``node_rank``),
    is what the c10d rendezvous gives here: every node's ranks follow from its ``node_rank``."""
    if rdzv_backend == STATIC_BACKEND:
        rdzv_backend = "c10d"
    conf = check_rdzv_conf(rdzv_conf)
    rdzv_timeout = pop_join_timeout(conf, rdzv_timeout)
    given = (num_nodes, node_rank, rdzv_endpoint, rdzv_backend, max_restarts, rdzv_timeout)
    return make_node_plan(
        *(
            getattr(config, name) if value is None else value
            for name, value in zip(NODE_FIELDS, given, strict=True)
        ),
        rdzv_conf=conf,
        rdzv_id=rdzv_id,
        monitor_interval=monitor_interval,
    )
