"""The worker's inputs: one small serialisable dataclass, built in the kernel, and the launched
call it carries: pickled bytes, or, for a forked worker, the call itself in inherited memory."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...runtime.device_types import device_type
from ..transfer.pickling import loads
from .accelerate_env import accelerate_environment

__all__ = ["InheritedCall", "Payload", "WorkerArgs", "unpack_payload"]


@dataclass(frozen=True)
class InheritedCall:
    """The launched function and its arguments, as the kernel holds them: what a forked worker
    inherits with the kernel's memory, never pickled (a worker reads the kernel's objects, big
    tensors and arrays included, without a copy; objects that cannot be pickled work too).

    Attributes:
        function: what every rank runs.
        args: its positional arguments.
        kwargs: its keyword arguments.
    """

    function: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def __reduce__(self) -> Any:
        raise TypeError(
            "an InheritedCall reaches forked workers only, with the kernel's memory; "
            "a spawned worker needs the pickled payload"
        )


#: What a worker runs: the cloudpickled ``(function, args, kwargs)`` (its big buffers in a
#: shared-memory segment it names: :func:`~nb_accel.worker.transfer.pickling.loads`), or the
#: call itself.
Payload = bytes | InheritedCall


def unpack_payload(payload: Payload) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
    """The function, positional and keyword arguments ``payload`` carries."""
    if isinstance(payload, InheritedCall):
        return payload.function, payload.args, payload.kwargs
    function, args, kwargs = loads(payload)
    return function, args, kwargs


@dataclass(frozen=True)
class WorkerArgs:
    """Everything a worker needs to become rank ``rank`` of a launch.

    Attributes:
        rank: global rank.
        local_rank: rank on this node.
        world_size: total number of processes.
        local_world_size: processes on this node.
        node_rank: index of this node.
        store_path: file used as the rendezvous store (single node; no port, no socket).
        backend: ``"gloo"``, ``"nccl"``, or ``"cuda:nccl,cpu:gloo"`` (FSDP on GPUs).
        device_type: the device type's registered name (``"cpu"``, ``"cuda"``).
        timeout_s: bound on every collective, in seconds.
        mixed_precision: ``"no"``, ``"bf16"`` or ``"fp16"``.
        env: extra environment variables the worker sets before anything else.
        payload: the cloudpickled ``(function, args, kwargs)``, or, for a forked worker, the
            call itself (:class:`InheritedCall`).
        parent_pid: the kernel's pid; the worker exits if the kernel goes away.
        post_mortem_s: if the function raises, how long the worker waits, paused, for the
            kernel to open the debugger on its frames (0: it exits at once).
        prompt_clock: the kernel's prompt clock file: the rank keeps the launch's collective
            timeout itself, time at prompts left out (empty: torch keeps it).
        joins_at: for a pool's rank started in place of one that died, the pool's command
            at which the other ranks make their process group anew with it (-1: the rank
            makes the group with the others as they all start).
    """

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    store_path: str
    backend: str
    device_type: str
    timeout_s: float
    mixed_precision: str
    payload: Payload
    parent_pid: int
    env: dict[str, str] = field(default_factory=dict)
    post_mortem_s: float = 0.0
    prompt_clock: str = ""
    joins_at: int = -1

    def rank_environment(self) -> dict[str, str]:
        """The environment variables torchrun would set for this rank, those that make
        Accelerate's own ``Accelerator()`` join the launch, then ``env``."""
        variables = {
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "GROUP_RANK": str(self.node_rank),
            "NODE_RANK": str(self.node_rank),
            "ROLE_RANK": str(self.rank),
            "ROLE_WORLD_SIZE": str(self.world_size),
            "NB_ACCEL_LAUNCHED": "1",
            "NB_ACCEL_MIXED_PRECISION": self.mixed_precision,
            "NB_ACCEL_BACKEND": self.backend,
            **accelerate_environment(device_type(self.device_type), self.mixed_precision),
        }
        variables.update(self.env)
        return variables
