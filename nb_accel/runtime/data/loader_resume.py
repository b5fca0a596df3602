"""Where a prepared loader stands, for checkpoints, and how an interrupted epoch is resumed.

A resumed epoch must shuffle exactly as the interrupted one did, while the rest of the program
(dropout, augmentation in the training step) continues from where the checkpoint left the
random number generators. So every iteration remembers the generators' states at its start;
a checkpoint taken in the middle of an epoch stores them, and the first iteration after
:meth:`~nb_accel.Accelerator.load_state` *replays* that start: it puts the generators back to
the epoch's starting states, starts the iteration (synchronisation, the loader's base seed, the
sampler's permutation), and then hands the global generators back the states the checkpoint
saved. The loader's own generators (the sampler's) keep the state the replayed start gave them.

Skipping the batches already seen is the user's call, as with Accelerate:
``skip_first_batches(loader, n)`` carries the loader's position (and a pending replay) over.
A loader built on torchdata's ``StatefulDataLoader`` (``use_stateful_dataloader=True``) keeps
its torchdata position in the checkpoint too: restored, it continues with the next batch.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

import torch

from .rng import capture_rng_states, restore_rng_states

__all__ = [
    "Replay",
    "close_iteration",
    "inherit_position",
    "loader_generators",
    "loader_state",
    "open_iteration",
    "restore_loader_state",
    "samplers_of",
]


_openings = itertools.count()


def samplers_of(loader: Any) -> list[Any]:
    """The samplers under ``loader`` (through batch-sampler wrappers such as shards and skips)."""
    found: list[Any] = []
    node = loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
    for _ in range(16):  # wrappers nest a few levels at most
        if node is None:
            break
        found.append(node)
        inner = getattr(node, "batch_sampler", None)
        node = inner if inner is not None else getattr(node, "sampler", None)
    return found


def loader_generators(loader: Any) -> list[torch.Generator]:
    """The ``torch.Generator`` objects that belong to ``loader`` (its own, its samplers', its
    dataset's and the one it synchronises), each once, in a fixed order."""
    candidates = [
        getattr(loader, "synchronized_generator", None),
        loader.generator,
        *(getattr(sampler, "generator", None) for sampler in samplers_of(loader)),
        getattr(loader.dataset, "generator", None),
    ]
    unique: list[torch.Generator] = []
    for generator in candidates:
        if isinstance(generator, torch.Generator) and all(generator is not g for g in unique):
            unique.append(generator)
    return unique


def _snapshot(loader: Any) -> dict[str, Any]:
    return {
        "rng": capture_rng_states(),
        "generators": [generator.get_state() for generator in loader_generators(loader)],
    }


def _apply_generators(loader: Any, states: list[torch.Tensor]) -> None:
    generators = loader_generators(loader)
    if len(generators) != len(states):
        raise ValueError(
            f"the checkpoint holds {len(states)} random generator(s) for this data loader, "
            f"the loader has {len(generators)}: prepare the same loader (sampler, shuffle, "
            "generator) as in the run that saved it"
        )
    for generator, state in zip(generators, states, strict=True):
        generator.set_state(state)


class Replay:
    """The start of an interrupted epoch being replayed; :meth:`finish` hands the global
    generators back the states the checkpoint saved."""

    def __init__(self, saved: dict[str, Any]) -> None:
        self._saved: dict[str, Any] | None = saved

    def finish(self) -> None:
        """Restore the checkpoint's global generator states (once; later calls do nothing)."""
        if self._saved is not None:
            restore_rng_states(self._saved)
            self._saved = None


def open_iteration(loader: Any) -> Replay | None:
    """Call first thing in an iteration, before any random number generator is touched.

    Remembers the generators' states at this epoch's start; when ``loader`` has an
    interrupted epoch to resume, replays its start instead and returns the :class:`Replay`
    to finish once the first batch has been drawn.
    """
    point = loader.__dict__.pop("_resume_point", None)
    loader._in_epoch = True
    loader._abandoned = False
    loader._batches_seen = 0
    loader._opened = next(_openings)
    if point is None:
        loader._epoch_start = _snapshot(loader)
        return None
    saved = capture_rng_states()
    restore_rng_states(point["rng"])
    _apply_generators(loader, point["generators"])
    loader._epoch_start = point
    return Replay(saved)


def close_iteration(loader: Any, completed: bool) -> None:
    """Call when an iteration ends (``completed``) or is abandoned (a ``break``: the epoch
    counts as interrupted, so a checkpoint taken now resumes it). A loader made by
    ``skip_first_batches`` passes its epoch count back to the loader it was made from."""
    loader._in_epoch = False
    loader._abandoned = not completed
    source_ref = loader.__dict__.get("_position_source")
    source = source_ref() if source_ref is not None else None
    if completed and source is not None:
        source.iteration = loader.iteration


def _latest(loader: Any) -> Any:
    """``loader``, or the ``skip_first_batches`` loader made from it if that one iterated last."""
    derived_ref = loader.__dict__.get("_derived")
    derived = derived_ref() if derived_ref is not None else None
    if derived is not None and getattr(derived, "_opened", -1) > getattr(loader, "_opened", -1):
        return derived
    return loader


def loader_state(loader: Any) -> dict[str, Any]:
    """What a checkpoint keeps of ``loader``: its epoch count, whether an epoch is under way
    or was left part-way (with the generators' states at its start), and its generators'
    current states (and a stateful loader's torchdata position). An epoch whose every batch
    has been handed out counts as finished."""
    current = _latest(loader)
    iteration = int(getattr(current, "iteration", 0))
    interrupted = bool(
        getattr(current, "_in_epoch", False) or getattr(current, "_abandoned", False)
    )
    if interrupted and getattr(current, "end_of_dataloader", False):
        interrupted, iteration = False, iteration + 1  # saved after the epoch's last batch
    sampler_seeds = [
        int(sampler.initial_seed)
        for sampler in samplers_of(loader)
        if hasattr(sampler, "initial_seed")
    ]
    state = {
        "iteration": iteration,
        "in_epoch": interrupted,
        "batches_seen": int(getattr(current, "_batches_seen", 0)),
        "epoch_start": current._epoch_start if interrupted else None,
        "generators": [generator.get_state() for generator in loader_generators(loader)],
        "sampler_seeds": sampler_seeds,
    }
    if getattr(current, "use_stateful_dataloader", False):
        state["torchdata"] = current.torchdata_position()
    return state


def restore_loader_state(loader: Any, state: dict[str, Any]) -> None:
    """Put ``loader`` where :func:`loader_state` found it; an epoch that was under way is
    replayed from its start at the next iteration (see the module's notes)."""
    _apply_generators(loader, state["generators"])
    seeded = [sampler for sampler in samplers_of(loader) if hasattr(sampler, "initial_seed")]
    for sampler, seed in zip(seeded, state["sampler_seeds"], strict=False):
        sampler.initial_seed = seed
    loader.iteration = state["iteration"]
    loader._in_epoch = loader._abandoned = False
    position = state.get("torchdata")
    if position is not None and getattr(loader, "use_stateful_dataloader", False):
        loader.load_torchdata_position(position)
    if state["in_epoch"]:
        loader._resume_point = state["epoch_start"]
    else:
        loader.__dict__.pop("_resume_point", None)


def inherit_position(new: Any, source: Any) -> None:
    """Give ``new`` (made by ``skip_first_batches`` from ``source``) the source's epoch count
    and its pending replay; ``new`` reports its epoch count back when it finishes."""
    new.iteration = getattr(source, "iteration", 0)
    point = source.__dict__.pop("_resume_point", None)
    if point is not None:
        new._resume_point = point
    new._position_source = weakref.ref(source)
    source._derived = weakref.ref(new)
