"""The launched function and its arguments on their way to the workers: inherited as they are
by forked workers, serialised with cloudpickle (with clear errors) for the others."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import cloudpickle

from ..runtime.workers.code_files import dumps as dumps_keeping_files
from ..runtime.workers.spec import InheritedCall, Payload

__all__ = ["check_arguments", "make_payload", "launch_payload"]


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


def check_arguments(
    function: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> None:
    """Raise ``TypeError`` in the kernel when ``function`` cannot take ``args`` and ``kwargs``
    (a missing argument, one too many, an unknown keyword), before any worker starts.
    Functions whose signature cannot be read are let through."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*args, **kwargs)
        return
    except TypeError as exc:
        problem = str(exc)
    given = f"{len(args)} positional argument{'s' if len(args) != 1 else ''}"
    if kwargs:
        given += " and keywords " + ", ".join(map(repr, kwargs))
    plain = signature.replace(
        parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
        return_annotation=signature.empty,
    )
    raise TypeError(  # raised outside the except: no "during handling" context to show
        f"{_name_of(function)}{plain} cannot be called with {given}: {problem}. "
        "Pass its arguments as `args=(...)` and `kwargs={...}`; nothing was started."
    )


def make_payload(
    function: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> bytes:
    """Cloudpickle ``(function, args, kwargs)``; raise ``TypeError`` naming what cannot travel."""
    try:
        return dumps_keeping_files((function, tuple(args), dict(kwargs)))
    except Exception as exc:  # noqa: BLE001 - any pickling error means "cannot travel"
        raise TypeError(
            f"notebook_launcher cannot send {_culprit(function, args, kwargs)} to the workers: "
            f"{type(exc).__name__}: {exc}. Objects such as open files, locks, sockets, threads "
            "and generators cannot be pickled; create them inside the launched function instead."
        ) from None


def launch_payload(
    function: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    inherited: bool,
) -> Payload:
    """What a launch's workers run: with ``inherited`` (workers forked from this process), the
    call itself, which they inherit with the kernel's memory (nothing is pickled: a big global
    or argument is not copied, and objects that cannot be pickled work too); else the
    cloudpickled call (:func:`make_payload`)."""
    if inherited:
        return InheritedCall(function, tuple(args), dict(kwargs))
    return make_payload(function, args, kwargs)
