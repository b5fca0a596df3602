"""Advice for a GPU launch read from what NVML says, before any process starts: settings that
would be slow on these GPUs, and NCCL transports known to hang on them.

Each rule is a function of the GPUs it is given, so that it can be checked for any machine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .nvml import GpuInfo, GpuReport

__all__ = [
    "BF16_NATIVE_FROM",
    "GpuAdvice",
    "P2P_IB_FIXED_IN_DRIVER",
    "advise",
    "bf16_note",
    "nccl_transport_env",
]

#: The compute capability from which GPUs compute in bf16 natively (Ampere); older ones emulate it.
BF16_NATIVE_FROM = (8, 0)
#: GPU names on which NCCL's peer-to-peer and InfiniBand transports hang with older drivers.
P2P_IB_HANGS_ON = ("RTX 40",)
#: The first driver with which they no longer hang.
P2P_IB_FIXED_IN_DRIVER = "550.40.07"
#: The variables that turn those transports off.
P2P_IB_VARIABLES = ("NCCL_P2P_DISABLE", "NCCL_IB_DISABLE")


@dataclass(frozen=True)
class GpuAdvice:
    """One-line notes to show, and variables the workers get."""

    notes: tuple[str, ...] = ()
    worker_env: tuple[tuple[str, str], ...] = ()


def bf16_note(gpus: Sequence[GpuInfo]) -> str | None:
    """A note when one of ``gpus`` only emulates bf16 (compute capability below 8.0, like the
    T4's 7.5), else ``None``."""
    for gpu in gpus:
        if gpu.capability is not None and gpu.capability < BF16_NATIVE_FROM:
            major, minor = gpu.capability
            return (
                f"bf16 on {gpu.name} (compute capability {major}.{minor}) is emulated and slow; "
                "mixed_precision='fp16' runs at full speed there"
            )
    return None


def _driver_version(text: str) -> tuple[int, ...] | None:
    try:
        return tuple(int(part) for part in text.split("."))
    except ValueError:
        return None


def nccl_transport_env(
    gpus: Sequence[GpuInfo], driver: str | None, num_processes: int, environ: Mapping[str, str]
) -> tuple[dict[str, str], str | None]:
    """Accelerate's rule for consumer multi-GPU machines: with more than one rank on a machine
    with an RTX 40-series GPU and a driver older than 550.40.07, NCCL's peer-to-peer and
    InfiniBand transports hang, so the workers get ``NCCL_P2P_DISABLE=1`` and
    ``NCCL_IB_DISABLE=1`` (each unless ``environ`` sets it already) and a note says so.
    An unknown driver version changes nothing."""
    version = _driver_version(driver) if driver else None
    fixed = _driver_version(P2P_IB_FIXED_IN_DRIVER)
    if num_processes < 2 or version is None or fixed is None or version >= fixed:
        return {}, None
    names = [gpu.name for gpu in gpus if any(model in gpu.name for model in P2P_IB_HANGS_ON)]
    env = {name: "1" for name in P2P_IB_VARIABLES if name not in environ}
    if not names or not env:
        return {}, None
    note = (
        f"{names[0]} with driver {driver}: NCCL's peer-to-peer and InfiniBand transports can hang "
        f"with it, so the workers run with {' '.join(f'{k}=1' for k in env)} (slower transfers "
        f"between GPUs; driver {P2P_IB_FIXED_IN_DRIVER} or newer lifts this)"
    )
    return env, note


def advise(
    report: GpuReport | None, num_processes: int, precision: str, environ: Mapping[str, str]
) -> GpuAdvice:
    """Everything to say and set for a launch of ``num_processes`` ranks on the GPUs of
    ``report`` (nothing without a report)."""
    if report is None:
        return GpuAdvice()
    notes: list[str] = []
    slow = bf16_note(report.gpus) if precision == "bf16" else None
    if slow is not None:
        notes.append(slow)
    env, transports = nccl_transport_env(report.gpus, report.driver, num_processes, environ)
    if transports is not None:
        notes.append(transports)
    return GpuAdvice(tuple(notes), tuple(sorted(env.items())))
