"""Checking a launch request and deciding what to launch, before any process starts."""

from __future__ import annotations

import multiprocessing
import numbers
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .. import _env, _nvml
from ..config import MAX_TIMEOUT_S
from ..errors import LaunchError
from ..runtime.cuda_origin import first_cuda_call
from ..runtime.group_backends import new_group_backend, offload_asked_by_environment
from ..runtime.sharding import STRATEGIES, strategy_class
from ..runtime.state import MIXED_PRECISION_CHOICES
from .failures.whereabouts import Frame
from .gpu_advice import advise
from .processes import START_METHODS

__all__ = [
    "LaunchPlan",
    "make_plan",
    "sharding_for",
    "show_notes",
    "DEFAULT_TIMEOUT_S",
    "FORK_FALLBACK_NOTE",
    "cuda_culprit",
    "gpu_backend",
]

#: Default bound on one collective, in seconds (as torch.distributed's default).
DEFAULT_TIMEOUT_S = 1800.0

#: Said when workers cannot be forked because CUDA was initialised in the kernel (``{method}``:
#: the start method used instead).
FORK_FALLBACK_NOTE = (
    "CUDA was initialised in this kernel ({culprit}); starting workers with {method} instead "
    "of fork: about 2 s more per launch (each launch starts a fresh interpreter that imports "
    "torch)"
)


def cuda_culprit() -> str:
    """Who initialised CUDA in this kernel, in words: the first call that could have, and
    where in the user's code it was made; or how to find out."""
    call = first_cuda_call()
    if call is None:
        return (
            "before nb_accel was imported, so where cannot be told: make `import nb_accel` the "
            "notebook's first import and run again to have the line named"
        )
    frames = [Frame(path, line, function) for path, line, function in call.stack]
    mine = [frame for frame in frames if frame.library is None]
    caller = frames[-1] if frames else None
    text = f"by {call.function}"
    if caller is None:
        return text
    if caller.library is None:
        return f"{text} at {caller.place}"
    text += f" in {caller.library} ({Path(caller.path).name}, line {caller.line})"
    return f"{text}, reached from {mine[-1].place}" if mine else text


@dataclass(frozen=True)
class LaunchPlan:
    """What a launch will run: how many processes, where, how started."""

    num_processes: int
    device_type: str
    backend: str
    start_method: str
    mixed_precision: str
    timeout_s: float
    gradient_accumulation_steps: int = 1
    #: One-line notes shown when the launch starts (a changed start method, a slow setting).
    notes: tuple[str, ...] = ()
    #: Environment variables the workers get on top of the kernel's.
    worker_env: tuple[tuple[str, str], ...] = ()
    #: The sharding strategy's name (``runtime/sharding/registry.py``): ``"ddp"`` (every rank
    #: holds the whole model) or ``"fsdp"`` (sharded across the ranks).
    sharding: str = "ddp"

    def describe(self, world_size: int | None = None) -> str:
        """One truthful line, e.g. ``"Launching 2 processes on CPU (gloo; fork)"``; with FSDP
        it names the shards, one per rank of the launch (``world_size`` when several nodes take
        part, else this plan's processes): ``"... (gloo; fork, FSDP, 2 shards)"``."""
        plural = "es" if self.num_processes > 1 else ""
        if self.device_type == "cuda":
            where = f"{self.num_processes} GPU{'s' if self.num_processes > 1 else ''}"
        else:
            where = "CPU"
        extras = [f"{self.start_method}"]
        if self.mixed_precision != "no":
            extras.append(f"{self.mixed_precision} mixed precision")
        title = strategy_class(self.sharding).launch_title(world_size or self.num_processes)
        if title:
            extras.append(title)
        return (
            f"Launching {self.num_processes} process{plural} on {where} ({self.backend}; "
            + ", ".join(extras)
            + ")"
        )


def _check_num_processes(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"num_processes must be a positive int, got {value!r} ({type(value).__name__})"
        )
    if int(value) < 1:
        raise ValueError(f"num_processes must be a positive int (1 or more), got {value}")
    return int(value)


def _check_start_method(value: str | None) -> str:
    method = value or _env.default_start_method()
    if method not in START_METHODS:
        raise ValueError(f"start_method={method!r} is not supported; use one of {START_METHODS}")
    if method not in multiprocessing.get_all_start_methods():
        raise ValueError(
            f"start_method={method!r} is not available on this platform; use one of "
            f"{tuple(multiprocessing.get_all_start_methods())}"
        )
    return method


def _check_mixed_precision(value: object) -> str:
    if not isinstance(value, str) or value.lower() not in MIXED_PRECISION_CHOICES:
        raise ValueError(
            f"mixed_precision={value!r} is not valid; use one of "
            + ", ".join(repr(c) for c in MIXED_PRECISION_CHOICES)
        )
    return value.lower()


def _check_sharding(value: object) -> str:
    if not isinstance(value, str) or value not in STRATEGIES:
        raise ValueError(
            f"sharding={value!r} is not valid; use one of " + ", ".join(map(repr, STRATEGIES))
        )
    return value


def sharding_for(fsdp: object, saved: str) -> str:
    """The sharding a launch asked for with ``fsdp``: ``"fsdp"`` for True, ``"ddp"`` for
    False, ``saved`` (the saved configuration's) for None; anything else is a ``TypeError``."""
    if fsdp is None:
        return saved
    if not isinstance(fsdp, bool):
        raise TypeError(
            f"fsdp must be True, False or None (the saved configuration's sharding), got "
            f"{fsdp!r} ({type(fsdp).__name__})"
        )
    return "fsdp" if fsdp else "ddp"


def gpu_backend(sharding: str, environ: Mapping[str, str]) -> str:
    """The process group's backend on GPUs: NCCL, with gloo for CPU tensors beside it
    (``"cuda:nccl,cpu:gloo"``) when the launch shards with FSDP or the kernel's environment asks
    FSDP's CPU offload (``FSDP_OFFLOAD_PARAMS``).

    Offloaded shards, their gradients and optimizer state live in CPU memory, and the
    collectives on them (the gradient norm, rank 0's weights broadcast into the shards, whole
    state dicts) need a CPU backend in the default group, the one FSDP's device mesh and torch's
    state-dict functions use. That group exists before the launched function runs, and the
    plugin is often made inside it, where the launch cannot see whether it offloads: so every
    FSDP launch gets the gloo part (one more set of connections at start-up, nothing per step).
    A DDP launch stays on NCCL alone; a plugin made there with ``cpu_offload`` is refused
    when the model is prepared, saying to launch with ``fsdp=True``.
    """
    return new_group_backend(True, sharding == "fsdp" or offload_asked_by_environment(environ))


def _check_timeout(value: object) -> float:
    number = not isinstance(value, bool) and isinstance(value, numbers.Real)
    if not number or not 0 < float(value) <= MAX_TIMEOUT_S:  # type: ignore[arg-type]
        raise ValueError(
            f"timeout must be a positive number of seconds, at most {MAX_TIMEOUT_S:.0f} "
            f"(30 days), got {value!r}"
        )
    return float(value)  # type: ignore[arg-type]


def make_plan(
    num_processes: object,
    mixed_precision: object,
    start_method: str | None,
    timeout: object,
    cpu: bool,
    gradient_accumulation_steps: int = 1,
    sharding: object = "ddp",
) -> LaunchPlan:
    """Validate the launch options and decide device, backend and start method.

    Raises ``TypeError``/``ValueError`` for bad values and :class:`LaunchError` for a kernel
    state that forbids the launch, each saying what to do instead.
    """
    requested = _check_num_processes(num_processes)
    precision = _check_mixed_precision(mixed_precision)
    method = _check_start_method(start_method)
    timeout_s = _check_timeout(timeout)
    shards = _check_sharding(sharding)
    gpus = 0 if cpu else _env.cuda_device_count()
    if gpus == 0:
        return LaunchPlan(
            requested or 1,
            "cpu",
            "gloo",
            method,
            precision,
            timeout_s,
            gradient_accumulation_steps,
            sharding=shards,
        )
    count = requested or gpus
    if count > gpus:
        raise ValueError(
            f"num_processes={count} but only {gpus} GPU{'s are' if gpus > 1 else ' is'} visible; "
            f"use num_processes<={gpus}, or cpu=True to run {count} processes on the CPU"
        )
    method, notes = _start_method_for_cuda(method, explicit=start_method is not None)
    advice = advise(_nvml.gpu_report(), count, precision, os.environ)
    return LaunchPlan(
        count,
        "cuda",
        gpu_backend(shards, os.environ),
        method,
        precision,
        timeout_s,
        gradient_accumulation_steps,
        notes + advice.notes,
        advice.worker_env,
        shards,
    )


def _start_method_for_cuda(method: str, explicit: bool) -> tuple[str, tuple[str, ...]]:
    """``method``, or where forked workers could not use CUDA, the method used instead and a
    note saying so (an explicit ``fork`` is refused instead, saying how to fix it)."""
    if method != "fork" or _env.cuda_works_after_fork():
        return method, ()
    if explicit:
        raise LaunchError(
            f"CUDA is already initialised in this kernel ({cuda_culprit()}), so "
            "forked workers cannot use the GPU. Restart the kernel and keep every CUDA call "
            "(.cuda(), .to('cuda'), torch.cuda.*) inside the launched function, or pass "
            "start_method='spawn' or 'forkserver' (or leave it unset: nb_accel then starts "
            "workers with forkserver)."
        )
    available = multiprocessing.get_all_start_methods()
    instead = "forkserver" if "forkserver" in available else "spawn"
    return instead, (FORK_FALLBACK_NOTE.format(culprit=cuda_culprit(), method=instead),)


def show_notes(plan: LaunchPlan) -> None:
    """Print each of the plan's notes on its own line (stderr)."""
    for note in plan.notes:
        print(note, file=sys.stderr, flush=True)
