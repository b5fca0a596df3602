"""A launch's call as a pool sends it to its ranks: the function and its arguments (sealed
already), with what each rank of this machine takes on from the kernel first (see
:mod:`~nb_accel.worker.warm.call`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from ..._messages import Call
from ...worker.warm.call import kernel_rng_state

__all__ = ["call_command"]


def call_command(
    cell: int, data: bytes, environ_at_start: Mapping[str, str] | None, start_method: str
) -> Call:
    """Command ``cell``: run the call in ``data``. ``environ_at_start`` is the environment the
    ranks inherited when they started (``None``: they run on other machines, which inherit
    nothing of this kernel's): the variables changed since, ``sys.path``, the working folder
    and, for forked ranks, the kernel's random states go with the call."""
    if environ_at_start is None:
        return Call(cell, data=data)
    now = dict(os.environ)
    return Call(
        cell,
        data=data,
        environ_set={k: v for k, v in now.items() if environ_at_start.get(k) != v},
        environ_unset=tuple(k for k in environ_at_start if k not in now),
        sys_path=tuple(sys.path),
        cwd=os.getcwd(),
        rng=kernel_rng_state() if start_method == "fork" else b"",
    )
