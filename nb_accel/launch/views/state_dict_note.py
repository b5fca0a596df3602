"""The line that warns, where a launch's results arrive, of a state dict that came back with
a wrapper's names: keys that all carry DistributedDataParallel's ``module.``, ``torch.compile``'s
``_orig_mod.`` or activation checkpointing's ``_checkpoint_wrapped_module.``, which a fresh
model's ``load_state_dict`` does not match. The value itself is returned as it is."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["WRAPPERS", "show_wrapped_state_dicts", "wrapped_state_dict_note", "wrapper_of"]

#: Each wrapper's name segment, and whose it is.
WRAPPERS = {
    "module.": "DistributedDataParallel's",
    "_orig_mod.": "torch.compile's",
    "_checkpoint_wrapped_module.": "activation checkpointing's",
}


def _carries(key: str, segment: str) -> bool:
    return key.startswith(segment) or f".{segment}" in key


def wrapper_of(value: Any) -> str | None:
    """The wrapper segment every key of ``value`` carries, when ``value`` is a state dict
    (a non-empty mapping of names) whose keys all carry one; ``None`` otherwise."""
    if not isinstance(value, Mapping) or not value:
        return None
    keys = list(value)
    if not all(isinstance(key, str) for key in keys):
        return None
    for segment in WRAPPERS:
        if all(_carries(key, segment) for key in keys):
            return segment
    return None


def wrapped_state_dict_note(
    results: Sequence[Any] | Mapping[int, Any], first_rank: int = 0
) -> str | None:
    """One line naming the ranks whose result is a state dict with a wrapper's keys, and how
    to get plain keys (``None``: no such result). ``results``: each rank's value by rank, or
    in rank order from rank ``first_rank``."""
    ranked = results.items() if isinstance(results, Mapping) else enumerate(results, first_rank)
    found = [(rank, wrapper_of(value)) for rank, value in ranked]
    wrapped = [(rank, segment) for rank, segment in found if segment]
    if not wrapped:
        return None
    segment = str(wrapped[0][1])
    ranks = [rank for rank, _ in wrapped]
    who = (
        f"rank {ranks[0]} returned a state dict"
        if len(ranks) == 1
        else (f"ranks {', '.join(map(str, ranks))} returned state dicts")
    )
    if segment == "_checkpoint_wrapped_module.":
        remedy = f'drop "{segment}" from its keys before load_state_dict'
    else:
        remedy = "return accelerator.unwrap_model(model).state_dict() for plain keys"
    return (
        f'{who} whose keys all carry "{segment}" ({WRAPPERS[segment]} wrapper), which a fresh '
        f"model's load_state_dict does not match: {remedy}"
    )


def show_wrapped_state_dicts(
    results: Sequence[Any] | Mapping[int, Any], first_rank: int = 0
) -> None:
    """Print :func:`wrapped_state_dict_note`'s line (stderr) when there is one."""
    note = wrapped_state_dict_note(results, first_rank)
    if note:
        print(note, file=sys.stderr, flush=True)
