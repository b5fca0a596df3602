"""A launch on warm workers, as the worker runs it: it first takes on what a worker forked from
the kernel at launch time would have inherited (the kernel's environment variables, ``sys.path``,
working directory and, where the workers were forked, random generators' states), reloads the
user's own modules that changed on disk (:mod:`.fresh_modules`), starts from
fresh ``Accelerator`` states on the process group it already has, runs the function, and
finishes the trackers it left open, as a cold worker does before it reports."""

from __future__ import annotations

import os
import pickle
import random
import sys
from collections.abc import Callable
from typing import Any

import torch

from ..._messages import Call
from ...runtime.state import reset_all_states
from ...runtime.tracking.open_runs import finish_open_trackers
from ..transfer.pickling import loads
from .fresh_modules import note_new_modules, reload_changed_modules

__all__ = ["kernel_rng_state", "run_call"]


def kernel_rng_state() -> bytes:
    """The kernel's random generators' states (Python's, torch's, NumPy's where it is
    imported), pickled for :class:`~nb_accel._messages.Call`."""
    numpy = sys.modules.get("numpy")
    states = (
        random.getstate(),
        torch.get_rng_state().numpy().tobytes(),  # raw bytes: no tensor pickling
        numpy.random.get_state() if numpy is not None else None,
    )
    return pickle.dumps(states, protocol=pickle.HIGHEST_PROTOCOL)


#: This worker's environment before its first warm launch, and the names a launch set.
_baseline: dict[str, str] | None = None
_applied: set[str] = set()


def _take_kernels_environ(command: Call) -> None:
    """The worker's own environment with the kernel's changes since the workers started
    (those of an earlier launch that the kernel has undone since are undone too)."""
    global _baseline  # noqa: PLW0603 - one worker, one environment
    if _baseline is None:
        _baseline = dict(os.environ)
    for name in _applied - set(command.environ_set):
        if name in _baseline:
            os.environ[name] = _baseline[name]
        else:
            os.environ.pop(name, None)
    for name in command.environ_unset:
        os.environ.pop(name, None)
    os.environ.update(command.environ_set)
    _applied.clear()
    _applied.update(command.environ_set)


def _take_kernels_context(command: Call) -> None:
    _take_kernels_environ(command)
    if command.sys_path is not None:
        sys.path[:] = list(command.sys_path)
    if command.cwd is not None and os.getcwd() != command.cwd:
        os.chdir(command.cwd)
    if command.rng:
        python_state, torch_state, numpy_state = pickle.loads(command.rng)
        random.setstate(python_state)
        torch.set_rng_state(torch.frombuffer(bytearray(torch_state), dtype=torch.uint8))
        if numpy_state is not None:
            import numpy

            numpy.random.set_state(numpy_state)


def run_call(command: Call, check: Callable[[Any], None]) -> Any:
    """Run the launch's function as this rank and return its value, checked by ``check``
    (the worker's test of what the kernel can use); its trackers are finished either way."""
    _take_kernels_context(command)
    reload_changed_modules()  # before the call is unpickled: its references find the new code
    reset_all_states()
    function, args, kwargs = loads(command.data, consume=False)
    failed = True
    try:
        value = function(*args, **kwargs)
        check(value)
        failed = False
        return value
    finally:
        note_new_modules()  # what the function imported, as it was loaded
        finish_open_trackers(failed=failed)
