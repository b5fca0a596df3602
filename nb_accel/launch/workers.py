"""Starting a launch's worker processes: their arguments, environment and start data."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from .. import _env
from .._openmp import release_openmp_threads
from .._registry import registered_env
from ..runtime.device_types import DEVICE_TYPE_VARIABLE
from ..runtime.sharding import SHARDING_VARIABLE, strategy_class
from ..worker.debugging.breakpoints import PROMPTS_VARIABLE
from ..worker.process.spec import Payload, WorkerArgs
from ..worker.transfer.segments import SHARE_DIR_ENV
from .payload import LaunchPayload, sealed
from .plan import LaunchPlan
from .processes import WorkerProcess, send_start_data, start_worker

__all__ = ["start_workers", "sharding_env", "worker_env"]


def sharding_env(sharding: str) -> dict[str, str]:
    """What tells ``Accelerator()`` (nb_accel's and Accelerate's) to use the sharding strategy
    named ``sharding`` (``"fsdp2"``: FSDP2, ``"ddp"``), as the strategy says.
    ``ACCELERATE_USE_FSDP`` is set either way, so that a value left in the kernel's
    environment cannot contradict the launch."""
    return strategy_class(sharding).worker_env()


def worker_env(plan: LaunchPlan, single_node: bool = True) -> dict[str, str]:
    """Environment variables every worker of ``plan`` sets: its device type's name and what
    that type adds; on one node, the backends' sockets kept on the loopback interface; the
    sharding strategy's name and what :func:`sharding_env` says; the device mesh, as
    Accelerate's variables; where the kernel's registered plug-ins can be imported from (for
    workers that do not inherit them: ``nb_accel/_registry.py``)."""
    env: dict[str, str] = {}
    loopback = _env.loopback_interface() if single_node else None
    if loopback:
        # Single node: every socket the backends open stays on loopback.
        for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            if name not in os.environ:
                env[name] = loopback
    env[DEVICE_TYPE_VARIABLE] = plan.device_type
    env.update(plan.device.worker_env())
    if plan.gradient_accumulation_steps != 1:
        env["NB_ACCEL_GRADIENT_ACCUMULATION_STEPS"] = str(plan.gradient_accumulation_steps)
    env[SHARDING_VARIABLE] = plan.sharding
    env.update(sharding_env(plan.sharding))
    env.update(registered_env())
    env.update(plan.mesh.worker_env())
    env.update(plan.worker_env)
    return env


def _worker_args(
    plan: LaunchPlan, store_dir: str, sent: Payload, prompt_clock: str
) -> list[WorkerArgs]:
    # where big results are written; the kernel answers their prompts (input(), breakpoints)
    env = {**worker_env(plan), SHARE_DIR_ENV: store_dir, PROMPTS_VARIABLE: "1"}
    store_path = os.path.join(store_dir, "store")
    return [
        WorkerArgs(
            rank=rank,
            local_rank=rank,
            world_size=plan.num_processes,
            local_world_size=plan.num_processes,
            node_rank=0,
            store_path=store_path,
            backend=plan.backend,
            device_type=plan.device_type,
            timeout_s=plan.timeout_s,
            mixed_precision=plan.mixed_precision,
            payload=sent,
            parent_pid=os.getpid(),
            env=env,
            post_mortem_s=plan.post_mortem_s,
            prompt_clock=prompt_clock,
        )
        for rank in range(plan.num_processes)
    ]


def start_workers(
    plan: LaunchPlan,
    store_dir: str,
    payload: LaunchPayload,
    workers: list[WorkerProcess],
    prompt_clock: str = "",
    ranks: Sequence[int] | None = None,
    joins_at: int = -1,
) -> None:
    """Start one worker per rank running ``payload``, appending each to ``workers`` as it
    starts (so the caller can stop those already started if a later one fails). The launch's
    folder ``store_dir`` holds the rendezvous store and the shared-memory segments of the
    payload and of the results. Spawned workers receive their arguments once started: the
    payload's big buffers are written into shared memory while they start up. With a
    ``prompt_clock`` (the kernel keeps one for each launch and pool on this machine) the ranks
    keep the collective timeout themselves, the time at the kernel's prompts left out.

    ``ranks``: only these (``None``: every rank), each in place of one of a pool's ranks that
    died, joining the others' process group as they make it anew at the pool's command
    ``joins_at``."""
    later = plan.start_method == "spawn"
    first = b"" if later else sealed(payload, store_dir)
    all_args = [
        dataclasses.replace(args, joins_at=joins_at)
        for args in _worker_args(plan, store_dir, first, prompt_clock)
        if ranks is None or args.rank in ranks
    ]
    if plan.start_method == "fork":
        release_openmp_threads()  # else a worker's first multi-threaded region can hang
    for args in all_args:
        workers.append(start_worker(plan.start_method, args))
    if later:
        sent = sealed(payload, store_dir)  # big buffers written once, there
        all_args = [dataclasses.replace(args, payload=sent) for args in all_args]
    for worker, args in zip(workers, all_args, strict=False):
        send_start_data(worker, plan.start_method, args)
