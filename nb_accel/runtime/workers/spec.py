"""The worker's inputs: one small serialisable dataclass, built in the kernel."""

from __future__ import annotations

from dataclasses import dataclass, field

from .accelerate_env import accelerate_environment

__all__ = ["WorkerArgs"]


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
        backend: ``"gloo"`` or ``"nccl"``.
        device_type: ``"cpu"`` or ``"cuda"``.
        timeout_s: bound on every collective, in seconds.
        mixed_precision: ``"no"``, ``"bf16"`` or ``"fp16"``.
        env: extra environment variables the worker sets before anything else.
        payload: the cloudpickled ``(function, args, kwargs)``.
        parent_pid: the kernel's pid; the worker exits if the kernel goes away.
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
    payload: bytes
    parent_pid: int
    env: dict[str, str] = field(default_factory=dict)

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
            **accelerate_environment(self.device_type, self.mixed_precision),
        }
        variables.update(self.env)
        return variables
