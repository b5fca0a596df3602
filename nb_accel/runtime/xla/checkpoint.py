"""Checkpoints on XLA: everything written goes through the CPU first (as ``xm.save`` does), and
each rank's XLA random generator is saved next to its other random states.

The XLA generator moves on at every XLA step, collectives included, so its state is only
meaningful at a fixed point: :meth:`XlaRandomState.resume` sets it again as the last thing
``save_state`` does, and :func:`load_xla_random_state` as the last thing ``load_state`` does.
A resumed run then draws the numbers (dropout masks) the run that saved drew after saving.

Loading needs nothing special beyond that: weights and optimizer states are read on the CPU and
copied into the parameters on the device. Imported only on the XLA path.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
import torch_xla.core.xla_model as xm

from ..checkpoint.contents import CheckpointContents, safe_load
from ..tree import recursively_apply
from .device import is_xla_tensor, mark_step

__all__ = ["on_cpu", "contents_on_cpu", "XlaRandomState", "load_xla_random_state"]


def on_cpu(tree: Any) -> Any:
    """``tree`` (nested lists, tuples, dicts) with every XLA tensor copied to the CPU."""
    return recursively_apply(lambda t: t.detach().cpu(), tree, test_type=is_xla_tensor)


class _StateOnCpu:
    """A checkpointed object whose ``state_dict()`` comes back on the CPU; the rest passes
    through to the object itself."""

    def __init__(self, obj: Any) -> None:
        self._obj = obj

    def state_dict(self) -> Any:
        """The object's state, its XLA tensors copied to the CPU."""
        return on_cpu(self._obj.state_dict())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._obj, name)


def contents_on_cpu(contents: CheckpointContents) -> CheckpointContents:
    """The same contents, each object's ``state_dict()`` moved to the CPU (after running the
    pending XLA graph, so that every value is final)."""
    mark_step()
    views: Any = {
        "models": [_StateOnCpu(m) for m in contents.models],
        "optimizers": [_StateOnCpu(o) for o in contents.optimizers],
        "schedulers": [_StateOnCpu(s) for s in contents.schedulers],
        "custom": [_StateOnCpu(c) for c in contents.custom],
        "scaler": None if contents.scaler is None else _StateOnCpu(contents.scaler),
    }
    return dataclasses.replace(contents, **views)


def _random_state_file(folder: Path, process_index: int) -> Path:
    return folder / f"xla_random_state_{process_index}.pt"


class XlaRandomState:
    """This rank's XLA random generator (dropout on the device draws from it), taken when a
    checkpoint is saved."""

    def __init__(self) -> None:
        mark_step()
        self.seed = int(xm.get_rng_state())

    def write(self, folder: Path, process_index: int) -> None:
        """Save it into the checkpoint ``folder``."""
        torch.save({"seed": self.seed}, _random_state_file(folder, process_index))

    def resume(self) -> None:
        """Set the generator to it again (the last step of ``save_state``)."""
        xm.set_rng_state(self.seed)


def load_xla_random_state(
    folder: Path, process_index: int, load_kwargs: dict[str, Any] | None = None
) -> None:
    """Run the pending XLA step (the loaded values become device data), then restore this
    rank's XLA random generator when the checkpoint holds it (the last step of
    ``load_state``)."""
    mark_step()
    path = _random_state_file(folder, process_index)
    if path.is_file():
        xm.set_rng_state(int(safe_load(path, load_kwargs)["seed"]))
