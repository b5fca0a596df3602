"""What one machine of a launch runs, decided before any process starts: how many ranks, on which
device type (asked through its interface: ``runtime/device_types``), with which process-group
backend and start method, in which precision, sharded how."""

from __future__ import annotations

import multiprocessing
import numbers
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .. import _env
from .._env import autograd_threads_started, ray_connected
from ..config import MAX_TIMEOUT_S
from ..errors import LaunchError
from ..runtime.device_types import DeviceType, FirstUse, device_type
from ..runtime.device_types.group_backends import offload_asked_by_environment
from ..runtime.sharding import DEFAULT, strategy_class
from ..runtime.state import MIXED_PRECISION_CHOICES
from .failures.whereabouts import Frame
from .placement.mesh import MeshPlan
from .processes import START_METHODS

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "AUTOGRAD_STATE",
    "DEVICE_STATE",
    "FORK_FALLBACK_NOTE",
    "WARM_FALLBACK_NOTE",
    "LaunchPlan",
    "check_num_processes",
    "first_use_in_words",
    "make_plan",
    "show_notes",
]

#: Default bound on one collective, in seconds (as torch.distributed's default).
DEFAULT_TIMEOUT_S = 1800.0

#: Said when workers cannot be forked because of the kernel's state (``{state}``: the devices
#: it initialised, :data:`DEVICE_STATE`, or :data:`AUTOGRAD_STATE`; ``{method}``: the start
#: method used instead).
FORK_FALLBACK_NOTE = (
    "{state}; starting workers with {method} instead of fork: about 2 s more per launch (each "
    "launch starts a fresh interpreter that imports torch)"
)
#: Said instead of :data:`FORK_FALLBACK_NOTE` where the launch goes to warm workers for it.
WARM_FALLBACK_NOTE = (
    "{state}; launches run on warm workers, started once with {method} instead of fork "
    "(nb_accel.stop_workers() ends them; reuse_workers=False starts fresh ones at each launch, "
    "about 2 s more each)"
)
#: The kernel initialised the devices (``{runtime}``: ``CUDA``; ``{culprit}``: who did).
DEVICE_STATE = "{runtime} was initialised in this kernel ({culprit})"
#: The kernel ran a backward pass that started autograd's device threads (see
#: :func:`~nb_accel._env.autograd_threads_started`).
AUTOGRAD_STATE = (
    "torch's autograd started its device threads in this kernel (a backward pass ran here, "
    "after torch.compile or on a device), so forked workers could not run a backward pass"
)
#: The kernel is connected to a Ray cluster (see :func:`~nb_accel._env.ray_connected`).
RAY_STATE = (
    "this kernel is connected to a Ray cluster (ray.init), and a forked worker would break "
    "the kernel's connection to it"
)


def first_use_in_words(call: FirstUse | None) -> str:
    """Who initialised the devices in this kernel, in words: the first call that could have,
    and where in the user's code it was made; or how to find out."""
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
    """What one machine of a launch runs: how many ranks, on what, how started."""

    num_processes: int
    #: The device type's registered name (``"cpu"``, ``"cuda"``): see :attr:`device`.
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
    #: The sharding strategy's registered name (``runtime/sharding/registry.py``).
    sharding: str = DEFAULT
    #: True when the workers cannot be forked because the kernel initialised the devices
    #: (:attr:`start_method` is the one used instead).
    fork_fallback: bool = False
    #: Seconds the rank that raises waits, paused, for ``%debug`` (0: it ends at once).
    post_mortem_s: float = 0.0
    #: The device mesh the ranks are laid out on (Accelerate's ``ParallelismConfig`` sizes).
    mesh: MeshPlan = field(default_factory=MeshPlan)

    @property
    def device(self) -> DeviceType:
        """The device type the ranks run on."""
        return device_type(self.device_type)

    def describe(self, world_size: int | None = None) -> str:
        """One truthful line, e.g. ``"Launching 2 processes on CPU (gloo; fork)"``; the
        sharding strategy says its part for a launch of ``world_size`` ranks (when several
        machines take part; else this plan's): ``"... (gloo; fork, FSDP, 2 shards)"``, or the
        device mesh its own: ``"... (gloo; fork, mesh dp_shard 2 x tp 2)"``."""
        where, engine = self.device.describe_launch(self.num_processes, self.backend)
        extras = [self.start_method]
        if self.mixed_precision != "no":
            extras.append(f"{self.mixed_precision} mixed precision")
        title = strategy_class(self.sharding).launch_title(world_size or self.num_processes)
        mesh = self.mesh.describe()  # says the shards and the other dimensions itself
        if mesh or title:
            extras.append(mesh or title)  # type: ignore[arg-type]
        return f"Launching {where} ({engine}; " + ", ".join(extras) + ")"


def check_num_processes(value: object) -> int | None:
    """``num_processes`` as an int (``None`` when not given): ``TypeError`` or ``ValueError``
    unless a positive whole number."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"num_processes must be a positive int, got {value!r} ({type(value).__name__})"
        )
    if int(value) < 1:
        raise ValueError(f"num_processes must be a positive int (1 or more), got {value}")
    return int(value)


def _check_start_method(value: str | None, device: DeviceType) -> str:
    method = value or (device.start_methods or (_env.default_start_method(),))[0]
    if method not in START_METHODS:
        raise ValueError(f"start_method={method!r} is not supported; use one of {START_METHODS}")
    if method not in multiprocessing.get_all_start_methods():
        raise ValueError(
            f"start_method={method!r} is not available on this platform; use one of "
            f"{tuple(multiprocessing.get_all_start_methods())}"
        )
    if device.start_methods is not None and method not in device.start_methods:
        allowed = " or ".join(repr(m) for m in device.start_methods)
        raise ValueError(
            f"start_method={method!r}: workers on {device.label}s start with {allowed} only; "
            "leave start_method out"
        )
    return method


def _check_mixed_precision(value: object, device: DeviceType) -> str:
    if not isinstance(value, str) or value.lower() not in MIXED_PRECISION_CHOICES:
        raise ValueError(
            f"mixed_precision={value!r} is not valid; use one of "
            + ", ".join(repr(c) for c in MIXED_PRECISION_CHOICES)
        )
    if device.precisions is not None and value.lower() not in device.precisions:
        raise ValueError(
            f"mixed_precision={value!r} is not available on {device.label}s; use "
            + " or ".join(repr(p) for p in device.precisions)
        )
    return value.lower()


def _check_timeout(value: object) -> float:
    number = not isinstance(value, bool) and isinstance(value, numbers.Real)
    if not number or not 0 < float(value) <= MAX_TIMEOUT_S:  # type: ignore[arg-type]
        raise ValueError(
            f"timeout must be a positive number of seconds, at most {MAX_TIMEOUT_S:.0f} "
            f"(30 days), got {value!r}"
        )
    return float(value)  # type: ignore[arg-type]


def make_plan(
    device: DeviceType,
    num_processes: object,
    mixed_precision: object,
    start_method: str | None,
    timeout: object,
    gradient_accumulation_steps: int = 1,
    sharding: str = DEFAULT,
    environ: Mapping[str, str] | None = None,
    warm_fallback: bool = False,
    forked_here: bool = True,
) -> LaunchPlan:
    """Validate the launch options and decide what ``device``'s launch runs: ranks, backend,
    start method, notes and variables. ``warm_fallback``: where the workers cannot be forked,
    the launch goes to warm workers (the note says so). ``forked_here``: the workers are
    started by this process, whose state may keep them from being forked (False: by a node
    process on each host, which starts as a fresh interpreter).

    Raises ``TypeError``/``ValueError`` for bad values and :class:`LaunchError` for a kernel
    state that forbids the launch, each saying what to do instead.
    """
    environ = os.environ if environ is None else environ
    requested = check_num_processes(num_processes)
    precision = _check_mixed_precision(mixed_precision, device)
    method = _check_start_method(start_method, device)
    timeout_s = _check_timeout(timeout)
    count = device.ranks_per_node(requested)
    notes: tuple[str, ...] = ()
    if forked_here:
        method, notes = _start_method(
            device, method, explicit=start_method is not None, warm=warm_fallback
        )
    advice = device.advice(count, precision, environ)
    cpu_collectives = strategy_class(sharding).cpu_collectives
    return LaunchPlan(
        count,
        device.name,
        device.group_backend(cpu_collectives or offload_asked_by_environment(environ)),
        method,
        precision,
        timeout_s,
        gradient_accumulation_steps,
        notes + advice.notes,
        advice.worker_env,
        sharding,
        fork_fallback=bool(notes),  # only the fallback gives a start-method note
    )


def _start_method(
    device: DeviceType, method: str, explicit: bool, warm: bool = False
) -> tuple[str, tuple[str, ...]]:
    """``method``, or where forked workers could not use ``device`` (the kernel initialised
    it) or run a backward pass (the kernel's autograd started its device threads), the method
    used instead and a note saying so; an explicit ``fork``, or a device that forks only, is
    refused instead, saying how to fix it."""
    if method != "fork":
        return method, ()
    devices_fork = device.forks_safely()
    autograd = devices_fork and autograd_threads_started()
    if devices_fork and not autograd and not ray_connected():
        return method, ()
    culprit = first_use_in_words(device.first_use()) if device.tracks_first_use else ""
    available = [m for m in ("forkserver", "spawn") if m in multiprocessing.get_all_start_methods()]
    if device.start_methods is not None:
        available = [m for m in available if m in device.start_methods]
    if explicit or not available:
        instead = (
            ", or pass start_method='spawn' or 'forkserver' (or leave it unset: nb_accel then "
            "starts workers with forkserver)"
            if available
            else ""
        )
        if devices_fork and not autograd:
            raise LaunchError(
                f"{RAY_STATE}: pass start_method='spawn' or 'forkserver', or leave it unset "
                "(nb_accel then starts workers with forkserver)"
            )
        if devices_fork:
            raise LaunchError(
                f"{AUTOGRAD_STATE}. Restart the kernel and keep training steps inside the "
                f"launched function{instead}."
            )
        raise LaunchError(
            f"{device.runtime} is already initialised in this kernel"
            + (f" ({culprit})" if culprit else "")
            + f", so forked workers cannot use the {device.label}. Restart the kernel and keep "
            f"every {device.runtime} call ({device.first_calls}) inside the launched function"
            + instead
            + "."
        )
    if devices_fork:
        state = AUTOGRAD_STATE if autograd else RAY_STATE
    else:
        state = DEVICE_STATE.format(runtime=device.runtime, culprit=culprit)
    template = WARM_FALLBACK_NOTE if warm else FORK_FALLBACK_NOTE
    return available[0], (template.format(state=state, method=available[0]),)


def show_notes(plan: LaunchPlan) -> None:
    """Print each of the plan's notes on its own line (stderr)."""
    for note in plan.notes:
        print(note, file=sys.stderr, flush=True)
