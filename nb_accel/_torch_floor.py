"""The oldest torch nb_accel runs on, checked when the package is imported.

nb_accel is tested on torch 2.9 (Colab's TPU runtime) to the newest release. An older torch
lacks what it is built on: FSDP2's public ``fully_shard``, the public DTensor and device-mesh
APIs that tensor parallelism and HSDP use, ``torch.distributed.checkpoint``'s state-dict helpers,
and the process-group abort that frees ranks waiting on a failed one. Rather than fail later,
inside a worker, with an ``AttributeError`` about one of them, the import says what to do.
"""

from __future__ import annotations

import importlib.metadata
import re

__all__ = ["TORCH_FLOOR", "check_torch", "torch_problem"]

#: The oldest (major, minor) release of torch that nb_accel supports.
TORCH_FLOOR = (2, 9)


def torch_problem(version: str) -> str | None:
    """What is wrong with torch ``version`` (``"2.8.0+cu126"``) for nb_accel, or ``None``."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None or (int(found.group(1)), int(found.group(2))) >= TORCH_FLOOR:
        return None
    floor = ".".join(map(str, TORCH_FLOOR))
    return (
        f"nb_accel needs torch {floor} or newer, and this environment has torch {version}. "
        f"Upgrade it (pip install -U 'torch>={floor}'; on Colab and Kaggle the runtimes' own "
        "torch is recent enough), then restart the kernel."
    )


def check_torch() -> None:
    """Raise ``ImportError`` (saying what to do) when the installed torch is too old."""
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return  # torch itself will say it is missing, on first use
    problem = torch_problem(version)
    if problem is not None:
        raise ImportError(problem)


check_torch()  # on import: before anything uses torch
