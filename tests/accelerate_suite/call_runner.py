"""Runs one test call of a multi-process test script, on every rank of a launch.

A test script's ``main()`` sets up its state and then calls its test functions one after the
other. Here every test function the script defines is wrapped: a call made straight from ``main()``
is numbered, and only the call with the chosen number runs (with everything it calls in turn);
the others return ``None`` at once. Running ``main()`` with no number chosen lists the calls
without running any. So one launch runs one test, with the setup its script gives it.

The same module serves both sides: ``run_call`` is what ``nb_accel.notebook_launcher`` runs,
and ``python call_runner.py SCRIPT INDEX RESULT`` is what ``accelerate launch`` runs.
"""

from __future__ import annotations

import enum
import functools
import importlib.util
import inspect
import json
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any


def is_test_function(name: str) -> bool:
    """Whether a script's function is one of its tests (by the scripts' naming: ``test_*``,
    ``check_*``, ``*_check``); helpers such as ``create_accelerator`` always run."""
    return name.startswith(("test_", "check_")) or name.endswith("_check")


class _Calls:
    """The calls ``main()`` made so far, the one to run, and whether a test call is running."""

    def __init__(self, chosen: int) -> None:
        self.chosen = chosen
        self.made: list[str] = []
        self.depth = 0


def describe_value(value: Any) -> str:
    """A short, stable text for an argument of a test call (its type for rich objects)."""
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return "{" + ", ".join(f"{k!r}: {describe_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, type):
        return value.__name__
    return type(value).__name__


def describe_call(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """``name(arg, key=value)`` with each argument described by :func:`describe_value`."""
    parts = [describe_value(a) for a in args]
    parts += [f"{k}={describe_value(v)}" for k, v in kwargs.items()]
    return f"{name}({', '.join(parts)})"


def _wrap(name: str, function: Callable[..., Any], calls: _Calls) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if calls.depth:
            return function(*args, **kwargs)
        number = len(calls.made)
        calls.made.append(describe_call(name, args, kwargs))
        if number != calls.chosen:
            return None
        calls.depth += 1
        try:
            return function(*args, **kwargs)
        finally:
            calls.depth -= 1

    return wrapper


def load_script(path: str) -> ModuleType:
    """Import the script at ``path`` as a module of its own (its ``__main__`` block stays idle)."""
    name = "suite_script_" + path.rsplit("/", 1)[-1].removesuffix(".py")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the test script {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run_call(path: str, chosen: int) -> list[str]:
    """Run ``main()`` of the script at ``path`` with only call number ``chosen`` taking place
    (-1: none), and return the calls ``main()`` made."""
    module = load_script(path)
    calls = _Calls(chosen)
    for name, value in list(vars(module).items()):
        if (
            inspect.isfunction(value)
            and value.__module__ == module.__name__
            and is_test_function(name)
        ):
            setattr(module, name, _wrap(name, value, calls))
    module.main()
    if chosen >= len(calls.made):
        raise LookupError(f"main() made {len(calls.made)} calls; there is no call {chosen}")
    return calls.made


def _main(argv: list[str]) -> None:
    path, chosen, result = argv[0], int(argv[1]), argv[2]
    made = run_call(path, chosen)
    rank = os.environ.get("RANK", "0")  # set by the launcher (main() may end the group)
    with open(f"{result}.{rank}", "w") as file:
        json.dump(made, file)


if __name__ == "__main__":
    _main(sys.argv[1:])
