"""How many ranks an XLA launch runs, in how many processes: decided from the runtime's facts.

``torch_xla``'s ``xmp.spawn`` (PJRT runtime) starts one process per chip on a TPU, because only
one process may open a chip. A chip of TPU v4 and later is one XLA device (v4 and v5p join
their two TensorCores into one; v5e and v6e have one), so each process runs one rank. A chip of
TPU v2 and v3 is two devices, one per TensorCore, and each process runs two ranks, one thread
each: a v2-8 or v3-8 runs 8 ranks in 4 processes. ``xmp.spawn`` takes ``nprocs=1`` (one rank,
on the first device) or every device, nothing in between. On the CPU device it runs one process
with a thread per device (``CPU_NUM_DEVICES``), on CUDA one process per GPU.

:class:`XlaFacts` holds what the runtime says (the TPU's generation comes from
``TPU_ACCELERATOR_TYPE``, such as ``v3-8``, or from ``torch_xla``'s ``tpu.version()``);
:func:`plan_xla` turns the facts and the requested ``num_processes`` into an :class:`XlaPlan`
or a ``ValueError`` naming the numbers that work. Every decision is a pure function of the
facts, checkable without a TPU; only :func:`read_xla_facts` imports ``torch_xla``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

__all__ = [
    "XlaFacts",
    "XlaPlan",
    "accelerator_generation",
    "tpu_generation",
    "tpu_facts",
    "plan_xla",
    "read_xla_facts",
]

_GENERATION = re.compile(r"^v(\d+)")


@dataclass(frozen=True)
class XlaFacts:
    """What the XLA runtime offers on this machine, as ``xmp.spawn`` would use it.

    Attributes:
        device_type: ``"TPU"``, ``"CPU"``, ``"CUDA"``, ... (``torch_xla.runtime.device_type()``).
        processes: worker processes ``xmp.spawn`` starts for every device (TPU: one per chip).
        devices_per_process: XLA devices each process drives, one rank (thread) each.
        accelerator: the TPU's accelerator type (``"v3-8"``) or generation (``"v3"``), for
            messages; empty elsewhere.
    """

    device_type: str
    processes: int
    devices_per_process: int = 1
    accelerator: str = ""

    @property
    def devices(self) -> int:
        """Every XLA device of this machine: the ranks of a launch that uses them all."""
        return self.processes * self.devices_per_process


@dataclass(frozen=True)
class XlaPlan:
    """What an XLA launch starts.

    Attributes:
        ranks: ranks in the launch (``num_processes`` in Accelerate's sense: one per device).
        processes: worker processes.
        threads_per_process: ranks each process runs, one thread each.
        spawn_nprocs: the ``nprocs`` given to ``xmp.spawn`` (``1``, or ``None``: every device).
        where: the devices, in words (``"TPU v3-8"``, ``"CPU"``).
    """

    ranks: int
    processes: int
    threads_per_process: int
    spawn_nprocs: int | None
    where: str

    def describe(self) -> str:
        """One line for the launch's title, e.g. ``8 ranks on TPU v3-8 (4 processes, 2
        threads each: one per TensorCore)``."""
        if self.threads_per_process == 1:
            plural = "es" if self.processes > 1 else ""
            return f"{self.processes} process{plural} on {self.where}"
        each = "one per TensorCore" if self.where.startswith("TPU") else "one per device"
        plural = "es" if self.processes > 1 else ""
        return (
            f"{self.ranks} ranks on {self.where} ({self.processes} process{plural}, "
            f"{self.threads_per_process} threads each: {each})"
        )


def accelerator_generation(accelerator_type: str | None) -> int | None:
    """The generation an accelerator type names (``"v3-8"``: 3), or ``None``."""
    found = _GENERATION.match((accelerator_type or "").strip().lower())
    return int(found.group(1)) if found else None


def tpu_generation(accelerator_type: str | None, version: int | None = None) -> int:
    """The TPU generation (2, 3, 4, 5, 6, ...) from the accelerator type (``"v3-8"``,
    ``"v5litepod-8"``, ``"v6e-8"``) or, without one, from ``torch_xla``'s ``tpu.version()``.

    Raises:
        ValueError: neither says which generation this is.
    """
    generation = accelerator_generation(accelerator_type)
    if generation is not None:
        return generation
    if version is not None:
        return int(version)
    raise ValueError(
        f"cannot tell which TPU generation this is (TPU_ACCELERATOR_TYPE="
        f"{accelerator_type!r}, and torch_xla could not read the TPU's metadata): set "
        "TPU_ACCELERATOR_TYPE to your TPU's type, e.g. v3-8 or v5litepod-8, before launching"
    )


def tpu_facts(accelerator_type: str | None, version: int | None, processes: int) -> XlaFacts:
    """The facts of a TPU host: ``processes`` (one per chip, ``tpu.num_local_processes()``),
    and one device per chip, or two (one per TensorCore) on TPU v2 and v3."""
    generation = tpu_generation(accelerator_type, version)
    return XlaFacts(
        device_type="TPU",
        processes=processes,
        devices_per_process=2 if generation <= 3 else 1,
        accelerator=(accelerator_type or "").strip() or f"v{generation}",
    )


def _where(facts: XlaFacts) -> str:
    if facts.device_type == "TPU" and facts.accelerator:
        return f"TPU {facts.accelerator}"
    return facts.device_type


def _layout(facts: XlaFacts) -> str:
    """How the devices are laid out, in words, for a message."""
    if facts.device_type == "TPU" and facts.devices_per_process > 1:
        return (
            f"{facts.processes} chips with {facts.devices_per_process} TensorCores each: one "
            f"process per chip, running one rank per TensorCore as a thread, as torch_xla does"
        )
    if facts.device_type == "TPU":
        return f"{facts.processes} chips, one process and one rank each"
    if facts.devices_per_process > 1:
        return f"{facts.devices} devices, run as threads of one process"
    plural = "s" if facts.devices > 1 else ""
    return f"{facts.devices} device{plural}, one process each"


def plan_xla(facts: XlaFacts | None, num_processes: int | None) -> XlaPlan:
    """The launch for ``num_processes`` ranks on these devices (``facts``: ``None`` when the
    runtime cannot tell; then every device is used, however many there are).

    ``None`` or the number of devices runs one rank on every device; ``1`` runs one rank on
    the first device (on TPU v2/v3: one TensorCore of the first chip).

    Raises:
        ValueError: any other number, with the numbers that work.
    """
    if num_processes == 1:
        return XlaPlan(1, 1, 1, 1, _where(facts) if facts else "XLA")
    if facts is None:
        return XlaPlan(num_processes or 1, num_processes or 1, 1, None, "XLA")
    if num_processes is None or num_processes == facts.devices:
        return XlaPlan(
            facts.devices, facts.processes, facts.devices_per_process, None, _where(facts)
        )
    if facts.devices == 1:
        raise ValueError(
            f"num_processes={num_processes}, but this {_where(facts)} offers one XLA device, "
            "so a launch runs one rank: pass num_processes=1 or leave it out"
        )
    raise ValueError(
        f"num_processes={num_processes}, but this {_where(facts)} runs either 1 rank or "
        f"{facts.devices} ({_layout(facts)}): pass num_processes={facts.devices} or leave it "
        "out to use every device, or num_processes=1 for one"
    )


def _tpu_facts() -> XlaFacts:
    from torch_xla._internal import tpu

    accelerator = os.environ.get("TPU_ACCELERATOR_TYPE")
    version = None
    if accelerator_generation(accelerator) is None:  # ask the TPU's metadata, as torch_xla does
        try:
            version = int(tpu.version())
        except Exception:  # noqa: BLE001 - tpu_facts says what to set
            version = None
    return tpu_facts(accelerator, version, int(tpu.num_local_processes()))


def read_xla_facts() -> XlaFacts | None:
    """What this machine's XLA runtime offers, read as ``xmp.spawn`` reads it and without
    starting the runtime (this imports ``torch_xla``); ``None`` when it cannot tell.

    Raises:
        ValueError: on a TPU whose generation neither ``TPU_ACCELERATOR_TYPE`` nor the TPU's
            metadata tells.
    """
    import torch_xla.runtime as xr

    kind = xr.device_type() or "CPU"
    if kind == "TPU":
        return _tpu_facts()  # a ValueError when the generation is unknown: raised as it is
    try:
        if kind == "CPU":
            return XlaFacts("CPU", 1, int(os.environ.get("CPU_NUM_DEVICES") or 1))
        from torch_xla.experimental import plugins

        if plugins.using_dynamic_plugins():
            return XlaFacts(kind, int(plugins.default().physical_chip_count()))
        count = os.environ.get(f"{'GPU' if kind == 'CUDA' else kind}_NUM_DEVICES")
        return XlaFacts(kind, int(count)) if count else None
    except Exception:  # noqa: BLE001 - unknown is an answer too
        return None
