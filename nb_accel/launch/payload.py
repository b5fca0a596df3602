"""The launched function and its arguments on their way to the workers: inherited as they are
by forked workers; for the others, serialised with cloudpickle (with clear errors), their big
buffers (tensors, arrays) kept aside to be written once into shared memory."""

from __future__ import annotations

import contextlib
import inspect
import sys
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import cloudpickle

from ..worker.process.spec import InheritedCall, Payload
from ..worker.transfer.code_files import installed_code
from ..worker.transfer.pickling import Pickled, pickle_sharing

__all__ = [
    "LaunchPayload",
    "check_arguments",
    "launch_payload",
    "make_payload",
    "own_module_by_value",
    "sealed",
]

#: A launch's call on its way: inherited by forked workers, or pickled with its big buffers
#: aside (sealed into bytes once the launch has its folder: :func:`sealed`).
LaunchPayload = Pickled | InheritedCall


def _name_of(function: Callable[..., Any]) -> str:
    return getattr(function, "__qualname__", None) or repr(function)


def _travels(value: Any) -> bool:
    """Whether cloudpickle can pickle ``value``."""
    try:
        cloudpickle.dumps(value)
    except Exception:  # noqa: BLE001 - any pickling error means "cannot travel"
        return False
    return True


def _names_used(code: types.CodeType) -> Iterator[str]:
    """The global names ``code`` and the code nested in it (inner functions, lambdas,
    comprehensions) refer to, in order of first use."""
    yield from code.co_names
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _names_used(constant)


def _what_refers(function: types.FunctionType) -> Iterator[tuple[str, Any]]:
    """What ``function`` refers to and cloudpickle sends with it, by how the user wrote it:
    the globals it uses, the variables it closes over, its defaults."""
    seen: set[str] = set()
    for name in _names_used(function.__code__):
        if name in function.__globals__ and name not in seen:
            seen.add(name)
            yield f"the global `{name}`", function.__globals__[name]
    cells = function.__closure__ or ()
    for name, cell in zip(function.__code__.co_freevars, cells, strict=False):
        with contextlib.suppress(ValueError):  # an empty cell sends nothing
            yield f"the variable `{name}` from an enclosing function", cell.cell_contents
    defaults = function.__defaults__ or ()
    positional = function.__code__.co_varnames[: function.__code__.co_argcount]
    for name, value in zip(positional[len(positional) - len(defaults) :], defaults, strict=True):
        yield f"the default of `{name}`", value
    for name, value in (function.__kwdefaults__ or {}).items():
        yield f"the default of `{name}`", value


def _culprit_inside(function: Any, seen: set[int]) -> tuple[str, list[str]] | None:
    """What ``function`` refers to that cannot be pickled (in words), and the functions it is
    reached through, ``function`` first; ``None`` when none of it is the reason."""
    if not isinstance(function, types.FunctionType) or id(function) in seen:
        return None
    seen.add(id(function))
    for what, value in _what_refers(function):
        if _travels(value):
            continue
        inner = _culprit_inside(value, seen)
        if inner is not None:
            return inner[0], [_name_of(function), *inner[1]]
        return f"{what} (a {type(value).__name__})", [_name_of(function)]
    return None


def _culprit(function: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    """Which part of the payload cannot be pickled, in words."""
    if not _travels(function):
        inside = _culprit_inside(function, set())
        if inside is not None:
            what, through = inside
            via = f" (through {', '.join(map(repr, through[1:]))})" if len(through) > 1 else ""
            return f"{what}, which {through[0]!r} uses{via},"
        return f"the function {_name_of(function)!r} (or something it refers to)"
    for index, value in enumerate(args):
        if not _travels(value):
            return f"args[{index}] (a {type(value).__name__})"
    for key, value in kwargs.items():
        if not _travels(value):
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
) -> Pickled:
    """Cloudpickle ``(function, args, kwargs)``, big buffers aside; raise ``TypeError`` naming
    what cannot travel."""
    try:
        return pickle_sharing((function, tuple(args), dict(kwargs)))
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
    elsewhere: bool = False,
) -> LaunchPayload:
    """What a launch's workers run: with ``inherited`` (workers forked from this process), the
    call itself, which they inherit with the kernel's memory (nothing is pickled: a big global
    or argument is not copied, and objects that cannot be pickled work too); else the
    cloudpickled call (:func:`make_payload`). With ``elsewhere`` (workers on other machines,
    which may not have the user's files), the function's own module travels by value unless
    it is an installed package's."""
    if inherited:
        return InheritedCall(function, tuple(args), dict(kwargs))
    with own_module_by_value(function, elsewhere):
        return make_payload(function, args, kwargs)


@contextlib.contextmanager
def own_module_by_value(function: Callable[..., Any], elsewhere: bool = True) -> Iterator[None]:
    """While it lasts, ``function``'s module is pickled by value where it is the user's own
    file and the workers are on other machines (``elsewhere``), which may not have it."""
    module = sys.modules.get(getattr(function, "__module__", "") or "")
    if not elsewhere or module is None or not _users_own(module):
        yield
        return
    cloudpickle.register_pickle_by_value(module)
    try:
        yield
    finally:
        cloudpickle.unregister_pickle_by_value(module)


def _users_own(module: types.ModuleType) -> bool:
    """Whether ``module`` is the user's own file (a script, a test, a module next to the
    notebook), not the standard library's or an installed package's."""
    path = getattr(module, "__file__", None)
    if module.__name__ == "__main__" or not path:
        return False  # the notebook's own code is pickled by value anyway
    return not installed_code(path)


def sealed(payload: LaunchPayload, folder: str | None) -> Payload:
    """``payload`` as the workers receive it: a pickled call's big buffers written once into
    a shared-memory segment in ``folder`` (the launch's, removed with it), which every worker
    maps; without a folder they travel inside the bytes."""
    return payload.seal(folder) if isinstance(payload, Pickled) else payload
