"""Serialising the launched function and its arguments with cloudpickle, with clear errors."""

from __future__ import annotations

import pickle
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import cloudpickle

__all__ = ["make_payload"]


def _name_of(function: Callable[..., Any]) -> str:
    return getattr(function, "__qualname__", None) or repr(function)


def _culprit(function: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    """Which part of the payload cannot be pickled, in words."""
    try:
        cloudpickle.dumps(function)
    except Exception:  # noqa: BLE001 - any pickling error means "cannot travel"
        return f"the function {_name_of(function)!r} (or something it refers to)"
    for index, value in enumerate(args):
        try:
            cloudpickle.dumps(value)
        except Exception:  # noqa: BLE001 - any pickling error means "cannot travel"
            return f"args[{index}] (a {type(value).__name__})"
    for key, value in kwargs.items():
        try:
            cloudpickle.dumps(value)
        except Exception:  # noqa: BLE001 - any pickling error means "cannot travel"
            return f"kwargs[{key!r}] (a {type(value).__name__})"
    return "the payload"


def make_payload(
    function: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> bytes:
    """Cloudpickle ``(function, args, kwargs)``; raise ``TypeError`` naming what cannot travel."""
    try:
        return cloudpickle.dumps(
            (function, tuple(args), dict(kwargs)), protocol=pickle.HIGHEST_PROTOCOL
        )
    except Exception as exc:
        raise TypeError(
            f"notebook_launcher cannot send {_culprit(function, args, kwargs)} to the workers: "
            f"{type(exc).__name__}: {exc}. Objects such as open files, locks, sockets, threads "
            "and generators cannot be pickled; create them inside the launched function instead."
        ) from exc
