"""Prepared loaders built on torchdata's ``StatefulDataLoader`` (``use_stateful_dataloader=True``).

Each loader class (``DataLoaderShard``, ``DataLoaderDispatcher``, ``SkipDataLoader``) has a
stateful variant, made on first use: a subclass of both the class and ``StatefulDataLoader``, so
that it is an instance of both. Passing ``use_stateful_dataloader=True`` to the class builds the
variant. torchdata is imported only then.

``state_dict()`` describes the position *after the last batch handed out* (the loaders read one
batch ahead, torchdata's own count would be one too far), so a loader that loads it continues
with the next batch. When order depends on more than torchdata keeps (the epoch of a
``SeedableRandomSampler``, the states of a shuffling sampler's generator at the start of the
epoch, which a resumed epoch replays), that goes in under the key ``"_nb_accel"``; a loader that
needs none of it gives exactly torchdata's dictionary.
"""

from __future__ import annotations

import inspect
import warnings
from collections import deque
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from ..._keywords import parameter_names
from ..environment import is_torchdata_stateful_dataloader_available
from .loader_resume import loader_state, restore_loader_state, samplers_of

__all__ = [
    "EXTRA_KEY",
    "StatefulChoice",
    "StatefulLoaderMixin",
    "loader_parameters",
    "require_stateful_dataloader",
    "stateful_variant",
]

#: Where a state dictionary keeps what torchdata's own does not hold.
EXTRA_KEY = "_nb_accel"

_VARIANTS: dict[type, type] = {}


def require_stateful_dataloader() -> None:
    """Raise a clear ``ImportError`` when torchdata's ``StatefulDataLoader`` is not installed."""
    if not is_torchdata_stateful_dataloader_available():
        raise ImportError(
            "use_stateful_dataloader=True builds prepared loaders on torchdata's "
            "StatefulDataLoader (torchdata 0.8 or newer), which is not installed: run "
            "`pip install nb_accel[stateful]` (or `pip install torchdata`) where the training "
            "runs, or leave use_stateful_dataloader unset"
        )


def stateful_variant(cls: type) -> type:
    """``cls``'s subclass that is also torchdata's ``StatefulDataLoader`` (made once)."""
    require_stateful_dataloader()
    variant = _VARIANTS.get(cls)
    if variant is not None:
        return variant
    from torchdata.stateful_dataloader import StatefulDataLoader

    name = f"Stateful{cls.__name__}"
    namespace = {
        "__module__": cls.__module__,
        "__qualname__": name,
        "__doc__": f"``{cls.__name__}`` built on torchdata's ``StatefulDataLoader``.",
        "use_stateful_dataloader": True,
        "_stateful_parameters": frozenset(
            inspect.signature(StatefulDataLoader.__init__).parameters
        ),
    }
    variant = type(name, (StatefulLoaderMixin, cls, StatefulDataLoader), namespace)
    _VARIANTS[cls] = variant
    return variant


def loader_parameters(loader: Any) -> list[str]:
    """The keyword names ``loader``'s class hands on to the loader it is built on: those of
    ``DataLoader``, and of torchdata's ``StatefulDataLoader`` for a stateful variant (which
    drops what an older torchdata lacks)."""
    names = parameter_names(DataLoader.__init__)
    stateful = getattr(loader, "_stateful_parameters", ())
    return [*names, *(name for name in stateful if name != "self")]


class StatefulChoice:
    """Base of the loader classes: ``Cls(..., use_stateful_dataloader=True)`` builds the
    class's stateful variant (see :func:`stateful_variant`)."""

    #: Whether this loader is built on torchdata's ``StatefulDataLoader``.
    use_stateful_dataloader: bool = False

    def __new__(cls, *args: Any, use_stateful_dataloader: bool = False, **kwargs: Any) -> Any:
        """Pick the stateful variant of ``cls`` when asked for it."""
        chosen = cls
        if use_stateful_dataloader and not cls.use_stateful_dataloader:
            chosen = stateful_variant(cls)
        return super().__new__(chosen)


def _is_torchdata(sampler: Any) -> bool:
    return type(sampler).__module__.startswith("torchdata.")


def _needs_extra(loader: Any) -> bool:
    """Whether ``loader``'s order depends on more than torchdata's state holds."""
    if getattr(loader, "iteration", 0):
        return True
    if getattr(loader, "synchronized_generator", None) is not None:
        return True
    for sampler in samplers_of(loader):
        if _is_torchdata(sampler):
            continue  # its iterator keeps its generator's state
        if getattr(sampler, "generator", None) is not None or hasattr(sampler, "initial_seed"):
            return True
    return isinstance(getattr(loader.dataset, "generator", None), torch.Generator)


class StatefulLoaderMixin:
    """``state_dict()`` / ``load_state_dict()`` for the stateful variants of the loader classes.

    The loader classes call :meth:`_note_position` where a batch they are about to hand out
    was read (the shard: before it reads the next one), and the dispatcher calls
    :meth:`_handed_out` for every step it hands out.
    """

    use_stateful_dataloader = True
    _stateful_parameters: frozenset[str] = frozenset()
    _position: dict[str, Any] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.pop("use_stateful_dataloader", None)
        for name in [key for key in kwargs if key not in self._stateful_parameters]:
            # DataLoader arguments an older torchdata lacks (in_order): dropped at their default
            if name in ("in_order",) and kwargs[name] is True:
                del kwargs[name]
        with warnings.catch_warnings():  # torchdata's own, about a torch call it makes
            warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
            super().__init__(*args, **kwargs)
        self._positions: deque[dict[str, Any]] = deque()

    def _torchdata_state(self) -> dict[str, Any]:
        return dict(super().state_dict())  # type: ignore[misc]

    def _note_position(self) -> None:
        """Remember torchdata's state now as the position of the batch about to be handed out."""
        self._position = self._torchdata_state()

    def _global_batches(self) -> Iterator[Any]:
        """The dispatcher's global batches, each with torchdata's state once it was read."""
        self._positions.clear()  # read ahead by an iteration that was left part-way
        for batch in super()._global_batches():  # type: ignore[misc]
            self._positions.append(self._torchdata_state())
            yield batch

    def _handed_out(self, last: bool) -> None:
        """A dispatcher's step is handed out: its position becomes the loader's."""
        if self._positions:
            self._position = self._positions.popleft()
        if last and getattr(self, "_position", None) is not None:
            self._positions.clear()
            self._position = self._torchdata_state()  # the iteration has ended

    def torchdata_position(self) -> dict[str, Any] | None:
        """torchdata's state at the last batch handed out; ``None`` for a loader that has
        neither been iterated nor given a state (so that no loader workers start for it)."""
        if self._position is not None:
            return dict(self._position)
        if getattr(self, "_iterator", None) is None:
            pending = getattr(self, "next_iter_state", None)
            return dict(pending) if pending else None
        return self._torchdata_state()

    def load_torchdata_position(self, position: dict[str, Any]) -> None:
        """Start the next iteration at ``position`` (from :meth:`torchdata_position`)."""
        self._position = None
        self._positions.clear()
        super().load_state_dict(position)  # type: ignore[misc]

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands: a loader given it by :meth:`load_state_dict` continues
        with the batch after the last one this loader handed out."""
        state = self.torchdata_position()
        if state is None:
            state = self._torchdata_state()
        if _needs_extra(self):
            extra = loader_state(self)
            extra.pop("torchdata", None)
            state[EXTRA_KEY] = extra
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue, at the next iteration, from where ``state_dict`` was taken."""
        state = dict(state_dict)
        extra = state.pop(EXTRA_KEY, None)
        if extra is not None:
            restore_loader_state(self, extra)
        self.load_torchdata_position(state)
