"""What the plugin says about its options, once per process.

An option that has no effect in a setting (an FSDP1 option under FSDP2, ``cpu_offload`` on a CPU
launch, a ``buffer_dtype`` FSDP2's mixed precision has no place for) is accepted, as Accelerate
accepts it, and said to do nothing; an FSDP1 name that FSDP2 runs under another is said to be
translated. Each is one warning naming the option, the first time this process meets it, and
only on the main process: every rank runs the same code, so every rank would say the same (a
launch says it once, and a ``%%distributed`` pool once for all its cells). The warning names
the user's own line (the first frame outside nb_accel), not the plugin's.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

__all__ = ["FSDPOptionWarning", "said", "say_no_effect", "say_once"]

#: What this process has said already, by option.
_said: set[str] = set()


class FSDPOptionWarning(UserWarning):
    """An FSDP option that does nothing in this setting, or runs under another name."""


def say_once(option: str, text: str, stacklevel: int = 2) -> bool:
    """Warn ``"FullyShardedDataParallelPlugin(option): text"`` unless this process said
    something about ``option`` before; True when it warned.

    Args:
        option: the option as the user gave it (``"cpu_offload"``,
            ``"mixed_precision_policy['buffer_dtype']"``).
        text: what to say about it.
        stacklevel: as for ``warnings.warn``, counted from the caller.
    """
    if option in _said:
        return False
    _said.add(option)
    if not _main_process():
        return False
    warnings.warn(
        f"FullyShardedDataParallelPlugin({option}): {text}",
        FSDPOptionWarning,
        stacklevel=max(stacklevel + 1, _users_level()),
    )
    return True


#: The package's folder: frames in it are nb_accel's own.
_PACKAGE = str(Path(__file__).resolve().parents[2]) + os.sep


def _users_level() -> int:
    """The ``stacklevel`` (counted from :func:`say_once`'s own ``warnings.warn``) of the
    first frame outside nb_accel: the user's line that led here."""
    level, frame = 1, sys._getframe(1)
    while frame.f_code.co_filename.startswith(_PACKAGE) and frame.f_back is not None:
        level, frame = level + 1, frame.f_back
    return level


def _main_process() -> bool:
    """Whether this is the launch's main process (rank 0), or no launch's."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return os.environ.get("RANK", "0") == "0"


def say_no_effect(option: str, why: str, stacklevel: int = 2) -> bool:
    """:func:`say_once` that ``option`` has no effect, and ``why``."""
    return say_once(option, f"no effect, {why}", stacklevel + 1)


def said() -> frozenset[str]:
    """The options this process has said something about."""
    return frozenset(_said)
