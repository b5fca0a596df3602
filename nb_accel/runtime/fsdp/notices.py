"""What the plugin says about its options, once per process.

An option that has no effect in a setting (an FSDP1 option under FSDP2, ``cpu_offload`` on a CPU
launch, a ``buffer_dtype`` FSDP2's mixed precision has no place for) is accepted, as Accelerate
accepts it, and said to do nothing; an FSDP1 name that FSDP2 runs under another is said to be
translated. Each is one warning naming the option, the first time this process meets it: a
launch's worker lives for that launch, so a launch says it once per rank, and a
``%%distributed`` pool's workers once for all their cells.
"""

from __future__ import annotations

import warnings

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
    warnings.warn(
        f"FullyShardedDataParallelPlugin({option}): {text}",
        FSDPOptionWarning,
        stacklevel=stacklevel + 1,
    )
    return True


def say_no_effect(option: str, why: str, stacklevel: int = 2) -> bool:
    """:func:`say_once` that ``option`` has no effect, and ``why``."""
    return say_once(option, f"no effect, {why}", stacklevel + 1)


def said() -> frozenset[str]:
    """The options this process has said something about."""
    return frozenset(_said)
