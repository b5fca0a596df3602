"""``InitProcessGroupKwargs`` applied to a process group that already exists.

A launch's workers join their process group before the user's function runs, so the options
cannot go to ``init_process_group`` any more: the timeout is set on the default group (for the
collectives issued from then on) and the backend is checked against the one in use.
"""

from __future__ import annotations

import warnings
from datetime import timedelta
from typing import Any, Protocol

import torch.distributed as dist

from .device_types.group_backends import backends_by_device
from .options import InitProcessGroupKwargs

__all__ = [
    "FAR_TIMEOUT",
    "DeadlineKeeper",
    "apply_process_group_options",
    "applied_timeout_s",
    "init_process_group_kwargs",
    "keep_own_deadline",
    "own_deadline",
    "set_group_timeout",
]

#: Accelerate's default backend, which every launch accepts (it means "the launch's backend").
_DEFAULT_BACKEND = "nccl"
#: The timeout this process gave its default group, in seconds (None: the launch's).
_applied: list[float] = []
#: The timeout of a group whose rank keeps its collective deadline itself: torch's own never
#: comes first (a week: longer than any wait the rank's deadline allows).
FAR_TIMEOUT = timedelta(days=7)


class DeadlineKeeper(Protocol):
    """What keeps a rank's collective deadline in place of torch's (the worker installs one,
    :mod:`~nb_accel.worker.debugging.deadline`)."""

    def set_timeout(self, seconds: float) -> None:
        """Time the collectives issued from now on against ``seconds``."""

    def forget_in_flight(self) -> None:
        """Forget the collectives in flight (their group was dropped)."""


#: The keeper of this rank's deadline, where the rank keeps it itself instead of the group.
_own_deadline: list[DeadlineKeeper] = []


def keep_own_deadline(keeper: DeadlineKeeper | None) -> None:
    """From now on give new timeouts to ``keeper`` (the rank keeps its collective deadline
    itself); ``None``: to the process group again."""
    _own_deadline[:] = [] if keeper is None else [keeper]


def own_deadline() -> DeadlineKeeper | None:
    """The keeper of this rank's collective deadline, or ``None`` where torch keeps it."""
    return _own_deadline[-1] if _own_deadline else None


def applied_timeout_s() -> float | None:
    """The collective timeout ``InitProcessGroupKwargs`` gave this process's default group,
    in seconds, or ``None`` when it keeps the one it was created with."""
    return _applied[-1] if _applied else None


def init_process_group_kwargs(handler: InitProcessGroupKwargs | None) -> dict[str, Any]:
    """What ``init_process_group`` receives when the ``Accelerator`` creates the group itself
    (under ``torchrun``): the options the user chose."""
    if handler is None:
        return {}
    kwargs: dict[str, Any] = {}
    if handler.backend not in (None, _DEFAULT_BACKEND):
        kwargs["backend"] = handler.backend
    if handler.init_method is not None:
        kwargs["init_method"] = handler.init_method
    if handler.chosen_timeout is not None:
        kwargs["timeout"] = handler.chosen_timeout
    return kwargs


def _same_backend(requested: str, in_use: str) -> bool:
    """``"gloo"`` is the backend of a group created as ``"gloo"`` or ``"cpu:gloo,cuda:nccl"``."""
    parts = set(backends_by_device(in_use).values())
    return requested.lower() in (in_use.lower(), *parts)


def _check_backend(requested: str | None) -> None:
    if requested in (None, _DEFAULT_BACKEND):
        return
    in_use = str(dist.get_backend())
    if _same_backend(str(requested), in_use):
        return
    raise ValueError(
        f"InitProcessGroupKwargs(backend={requested!r}): this launch's process group already "
        f"uses {in_use!r}, chosen by the launcher before the function started "
        "(nccl on GPUs, gloo on the CPU). Leave backend out, or choose the device with "
        "notebook_launcher(..., cpu=True) for gloo."
    )


def set_group_timeout(timeout: timedelta) -> None:
    """Give the running default process group ``timeout`` for its next collectives (the rank's
    own deadline takes it where the rank keeps the launch's timeout itself)."""
    if _own_deadline:
        _own_deadline[-1].set_timeout(timeout.total_seconds())
        _applied[:] = [timeout.total_seconds()]
        return
    group = dist.group.WORLD
    setter = getattr(group, "set_timeout", None)
    if setter is None:  # torch before ProcessGroup.set_timeout
        setter = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
    if setter is None:
        warnings.warn(
            "InitProcessGroupKwargs(timeout=...) cannot change the timeout of an existing "
            "process group with this version of torch; pass timeout= to notebook_launcher",
            stacklevel=4,
        )
        return
    setter(timeout)
    _applied[:] = [timeout.total_seconds()]


def apply_process_group_options(handler: InitProcessGroupKwargs | None) -> None:
    """Check ``handler``'s backend against the default group's, and give the group its
    timeout. Nothing to do without a handler or without a process group (one process)."""
    if handler is None or not (dist.is_available() and dist.is_initialized()):
        return
    _check_backend(handler.backend)
    if handler.chosen_timeout is not None:
        set_group_timeout(handler.chosen_timeout)
