"""A launch as it was asked for: the call, and the options as given (``None``: not given), before
the saved configuration and the environment fill them in (:mod:`.resolve`).

:class:`LaunchRequest` is the one list of a launch's options: ``notebook_launcher`` hands its
parameters to it by name, the ``%%distributed`` pool and its magics build one from theirs, and
the rest of the package reads the resolved :class:`~.spec.LaunchSpec`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from .payload import check_arguments

__all__ = ["LaunchCall", "LaunchRequest", "request_fields"]


@dataclass(frozen=True, kw_only=True)
class LaunchRequest:
    """The options of one launch, as the caller gave them; see ``notebook_launcher`` for what
    each means. ``None`` (and the defaults below) mean "not given": the saved configuration,
    then the built-in defaults decide."""

    num_processes: int | None = None
    mixed_precision: str | None = None
    start_method: str | None = None
    timeout: float | None = None
    cpu: bool | None = None
    prefix_output: bool = True
    use_port: str | int | None = None
    master_addr: str | None = None
    show_progress: bool = True
    all_ranks_metrics: bool = False
    num_nodes: int | None = None
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    rdzv_backend: str | None = None
    max_restarts: int | None = None
    rdzv_timeout: float | None = None
    fsdp: bool | None = None
    sharding: str | None = None
    hosts: str | Sequence[str] | None = None
    ssh_config: str | os.PathLike[str] | None = None
    remote_python: str | None = None
    rdzv_conf: Mapping[str, Any] | None = field(default=None, hash=False)
    rdzv_id: str | None = None
    monitor_interval: float | None = None
    log_line_prefix_template: str | None = None
    reuse_workers: bool | None = None
    parallelism_config: Any = field(default=None, hash=False)

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> LaunchRequest:
        """The request made of those of ``values`` that are options (a function's parameters,
        read with ``locals()``); the others are left out."""
        return cls(**{name: values[name] for name in request_fields() if name in values})

    def given(self) -> dict[str, Any]:
        """The options given, by name: those that differ from "not given"."""
        return {
            item.name: getattr(self, item.name)
            for item in fields(self)
            if getattr(self, item.name) != item.default
        }

    def replace(self, **changes: Any) -> LaunchRequest:
        """A copy with ``changes``."""
        return dataclasses.replace(self, **changes)


def request_fields() -> tuple[str, ...]:
    """The names of every launch option, in order."""
    return tuple(item.name for item in fields(LaunchRequest))


@dataclass(frozen=True)
class LaunchCall:
    """What every rank runs: ``function(*args, **kwargs)``."""

    function: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def checked(cls, function: object, args: object, kwargs: object) -> LaunchCall:
        """The call, once ``function`` is callable and takes ``args`` and ``kwargs``:
        ``TypeError`` saying what is wrong otherwise, before anything starts."""
        if not callable(function):
            raise TypeError(f"function must be callable, got {type(function).__name__}")
        if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
            raise TypeError(
                f"args must be a tuple of arguments, got {type(args).__name__}; "
                "for a single argument write args=(value,)"
            )
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise TypeError(
                f"kwargs must be a dict of keyword arguments, got {type(kwargs).__name__}"
            )
        check_arguments(function, args, kwargs or {})
        return cls(function, tuple(args), dict(kwargs or {}))
