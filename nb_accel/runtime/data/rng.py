"""Random number generators: seeding, and making every process draw the same numbers."""

from __future__ import annotations

import enum
import random
import sys
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist

from ..device_backends.choice import named_device_backend
from ..device_types import DeviceType, rank_device_type
from ..state import PartialState

__all__ = [
    "RNGType",
    "capture_rng_states",
    "restore_rng_states",
    "set_seed",
    "synchronize_rng_state",
    "synchronize_rng_states",
]


class RNGType(str, enum.Enum):
    """A random number generator that :func:`synchronize_rng_states` can synchronise
    (``CUDA``, Accelerate's name for it: the rank's device's own generator)."""

    TORCH = "torch"
    CUDA = "cuda"
    XLA = "xla"
    GENERATOR = "generator"


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seed Python's ``random``, NumPy (when installed) and torch (CPU, every CUDA device, and
    the XLA device in an XLA launch).

    Args:
        seed: the seed.
        device_specific: add the process index to the seed, so each process draws
            different numbers.
        deterministic: also ask torch for deterministic algorithms
            (``torch.use_deterministic_algorithms(True)``).
    """
    if device_specific:
        seed += PartialState().process_index
    random.seed(seed)
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device (lazily when CUDA is not up yet)
    if named_device_backend() is not None:  # a launch's own devices (XLA) have a generator
        PartialState().device_backend.seed_device(seed)
    else:  # the rank's device type, for a generator torch.manual_seed does not reach
        _rank_devices().seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)


def _rank_devices() -> DeviceType:
    """The rank's device type: its state's once that is built; else the one its launch named,
    or this process's (without building the state, which could make a process group)."""
    shared = PartialState._shared_state
    built = shared.get("device_type") if shared.get("initialized") else None
    return built if isinstance(built, DeviceType) else rank_device_type(None, 1, cpu=False)


def _broadcast_state(state: torch.Tensor) -> torch.Tensor:
    """Process 0's generator state, on every process."""
    partial = PartialState()
    moved = state.to(partial.device_type.collective_device(partial.backend, partial.device))
    dist.broadcast(moved, src=0)
    return moved.cpu()


def synchronize_rng_state(
    rng_type: RNGType | str | None = None, generator: torch.Generator | None = None
) -> None:
    """Give this process the state that process 0's generator of kind ``rng_type`` has.

    ``"torch"``: torch's default CPU generator; ``"cuda"``: the rank's (current) device's own
    generator, as its device type gives it (the GPU's; skipped on devices without one, the
    CPU's included); ``"generator"``: ``generator`` (skipped when ``None``); ``"xla"``: not
    available in this build, skipped. A no-op on a single process.
    """
    kind = RNGType(rng_type if rng_type is not None else RNGType.TORCH)
    partial = PartialState()
    if partial.num_processes <= 1 or not dist.is_initialized():
        return
    if kind == RNGType.TORCH:
        torch.set_rng_state(_broadcast_state(torch.get_rng_state()))
    elif kind == RNGType.CUDA:
        devices = partial.device_type
        device_state = devices.rng_state()
        if device_state is not None:
            devices.set_rng_state(_broadcast_state(device_state))
    elif kind == RNGType.GENERATOR and generator is not None:
        generator.set_state(_broadcast_state(generator.get_state()))


def synchronize_rng_states(
    rng_types: Iterable[RNGType | str], generator: torch.Generator | None = None
) -> None:
    """Call :func:`synchronize_rng_state` for each of ``rng_types`` (same order everywhere)."""
    for rng_type in rng_types:
        synchronize_rng_state(RNGType(rng_type), generator=generator)


def capture_rng_states() -> dict[str, Any]:
    """This process's global random number generators' states, as plain data and tensors.

    Python's ``random``, NumPy's global generator (when NumPy has been imported), torch's CPU
    generator and, under the name of the rank's device type, what that type saves of its
    devices' generators (on GPUs, once CUDA is initialised, every GPU's). The result holds only
    numbers, strings and tensors, so it loads back with ``weights_only=True``.
    """
    version, internal, gauss = random.getstate()
    devices = _rank_devices()
    states: dict[str, Any] = {
        "python": {"version": version, "state": torch.tensor(internal), "gauss": gauss},
        "torch": torch.get_rng_state(),
        "numpy": None,
        devices.name: devices.saved_rng_states(),
    }
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        kind, keys, pos, has_gauss, cached = numpy.random.get_state()
        states["numpy"] = {
            "kind": str(kind),
            "keys": torch.from_numpy(keys.astype("int64")),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        }
    return states


def restore_rng_states(states: dict[str, Any]) -> None:
    """Give this process's global generators the states :func:`capture_rng_states` returned."""
    python = states["python"]
    internal = tuple(int(value) for value in python["state"].tolist())
    random.setstate((python["version"], internal, python["gauss"]))
    torch.set_rng_state(states["torch"])
    numpy_state = states.get("numpy")
    if numpy_state is not None:
        import numpy

        keys = numpy_state["keys"].numpy().astype(numpy.uint32)
        numpy.random.set_state(
            (
                numpy_state["kind"],
                keys,
                numpy_state["pos"],
                numpy_state["has_gauss"],
                numpy_state["cached_gaussian"],
            )
        )
    devices = _rank_devices()
    device_states = states.get(devices.name)
    if device_states is not None:  # saved on devices of the rank's type
        devices.restore_rng_states(device_states)
