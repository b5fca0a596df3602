"""XLA devices (TPUs; XLA on the CPU or GPUs when ``PJRT_DEVICE`` asks) as a device type.

A kernel on a TPU runtime launches on its XLA devices: ``torch_xla``'s ``xmp.spawn`` forks one
process per chip, each running a rank per device (:mod:`.tpu_plan`), and the XLA launch backend
runs them (:attr:`XlaDevices.launcher`). Their ranks join no ``torch.distributed`` process
group: the XLA device backend (:mod:`.backend`) runs their collectives. ``torch_xla`` is
imported only when a launch asks for these devices.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from ...errors import LaunchError
from ..device_types.interface import DeviceType
from ..enums import DistributedType
from .tpu_plan import XlaPlan, plan_xla, read_xla_facts

__all__ = ["TPU_VARIABLES", "XlaDevices", "check_xla_matches_torch", "xla_requested"]

#: Environment variables that name a TPU: set by Colab (``COLAB_TPU_ADDR``, older runtimes),
#: by Kaggle and Cloud TPU VMs (``TPU_NAME``, ``TPU_ACCELERATOR_TYPE``) and by the older XRT
#: runtime (``XRT_TPU_CONFIG``).
TPU_VARIABLES = ("COLAB_TPU_ADDR", "TPU_NAME", "TPU_ACCELERATOR_TYPE", "XRT_TPU_CONFIG")


def _xla_reason(environ: Mapping[str, str]) -> str | None:
    """The environment variable that asks for XLA, as ``NAME=value``, or ``None``."""
    for name in ("PJRT_DEVICE", *TPU_VARIABLES):
        value = environ.get(name, "")
        if value:
            return f"{name}={value}"
    return None


def xla_requested(environ: Mapping[str, str] | None = None) -> bool:
    """True when launches should run on XLA devices through ``torch_xla``.

    That is when ``PJRT_DEVICE`` is set to anything (``TPU``; ``CPU`` or ``CUDA`` only when you
    set it yourself, which asks for XLA on those devices), or when one of
    :data:`TPU_VARIABLES` names a TPU. Empty values count as unset. Only the environment is
    read: nothing is imported.
    """
    return _xla_reason(os.environ if environ is None else environ) is not None


def _release(version: str) -> tuple[str, ...]:
    return tuple(version.split("+")[0].split(".")[:2])


def check_xla_matches_torch(torch_version: str, xla_version: str) -> None:
    """Refuse a torch_xla built for another torch release (``2.9`` against ``2.13``): its
    extension would fail to load or crash in the workers. An unknown version passes."""
    if not xla_version or _release(xla_version) == _release(torch_version):
        return
    wanted = ".".join(_release(torch_version))
    raise LaunchError(
        f"torch_xla {xla_version} is built for torch {'.'.join(_release(xla_version))}, but "
        f"this kernel has torch {torch_version}: install the matching pair, e.g. "
        f'pip install "torch_xla=={wanted}.*" (or torch of torch_xla\'s release), then '
        "restart the kernel"
    )


def import_xla() -> Any:
    """``torch_xla``'s ``xla_multiprocessing`` module, or a :class:`LaunchError` saying how
    to install it."""
    try:
        import torch_xla  # registers the XLA device with torch
        import torch_xla.distributed.xla_multiprocessing as xmp
    except ImportError as error:
        reason = _xla_reason(os.environ)
        where = (
            f"this is a TPU runtime ({reason}), and launching on it"
            if reason
            else "launching on XLA devices"
        )
        version = torch.__version__.split("+")[0]
        raise LaunchError(
            f"{where} needs torch_xla, which is not installed: "
            f'pip install "nb-accel[xla]" "torch_xla=={version}" (the version of your torch), '
            "then restart the kernel; or pass cpu=True to launch on the CPU instead "
            f"({type(error).__name__}: {error})"
        ) from error
    check_xla_matches_torch(torch.__version__, getattr(torch_xla, "__version__", ""))
    return xmp


class XlaDevices(DeviceType):
    """This machine's XLA devices, used whole or one at a time, through ``xmp.spawn``."""

    name: ClassVar[str] = "xla"
    cluster_resource: ClassVar[str] = "TPU"
    label: ClassVar[str] = "XLA device"
    distributed_type: ClassVar[DistributedType] = DistributedType.XLA
    runtime: ClassVar[str] = "XLA"
    first_calls: ClassVar[str] = "torch_xla.device(), .to('xla'), ..."
    process_group: ClassVar[bool] = False
    launcher: ClassVar[str | None] = "xla"
    precisions: ClassVar[tuple[str, ...] | None] = ("bf16", "no")
    start_methods: ClassVar[tuple[str, ...] | None] = ("fork",)

    def requested(self, environ: Mapping[str, str]) -> bool:
        """``PJRT_DEVICE`` set, or a TPU named (see :func:`xla_requested`)."""
        return xla_requested(environ)

    def visible_count(self) -> int:
        """Every XLA device of the machine, where the environment asks for them (this imports
        ``torch_xla``); none otherwise, and nothing is imported."""
        if not self.requested(os.environ):
            return 0
        return self.layout(None).ranks

    def layout(self, ranks: int | None) -> XlaPlan:
        """How ``ranks`` ranks (``None``: one per device) run: in how many processes, with how
        many threads each; a ``ValueError`` with the numbers that work."""
        import_xla()
        return plan_xla(read_xla_facts(), ranks)

    def ranks_per_node(self, requested: int | None) -> int:
        """Every device's rank, or one: what ``xmp.spawn`` can start."""
        return self.layout(requested).ranks

    def group_backend(self, cpu_collectives: bool) -> str:
        """``"xla"``: collectives run by the XLA device backend."""
        del cpu_collectives
        return "xla"

    def describe_launch(self, ranks: int, backend: str) -> tuple[str, str]:
        """``("8 ranks on TPU v3-8 (4 processes, 2 threads each: ...)", "xla: xmp.spawn")``."""
        del backend
        return self.layout(ranks).describe(), "xla: xmp.spawn"

    def forks_safely(self) -> bool:
        """False once this kernel uses the XLA device itself."""
        import torch_xla

        return not torch_xla._XLAC._xla_runtime_is_initialized()

    def accelerate_env(self) -> dict[str, str]:
        """``ACCELERATE_USE_CPU=false``, so that Accelerate does not pass over the XLA devices
        because of a value left in the kernel's environment."""
        return {"ACCELERATE_USE_CPU": "false"}

    def rank_device(self, local_rank: int) -> torch.device:
        """The rank's XLA device."""
        del local_rank
        from .device import xla_device

        return xla_device()

    def seed(self, seed: int) -> None:
        """Seed the XLA device's generator."""
        from .device import seed_device

        seed_device(seed)
