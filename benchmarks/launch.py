"""Launch benchmarks for nb_accel: launch overhead and failure latency, against a bare floor.

Run from the repository root::

    .venv/bin/python benchmarks/launch.py            # or: make bench

1. Launch + teardown of a 2-process function that does one ``torch.distributed.barrier()``:
   ``nb_accel.notebook_launcher`` against the bare floor (``torch.multiprocessing.start_processes``
   with fork, each rank doing ``init_process_group`` / ``barrier`` / ``destroy_process_group``)
   and, when installed, Accelerate's launcher. Contenders alternate within every round.
2. Failure latency: rank 1 raises as soon as the process group is up while rank 0 sleeps; the
   delay from the raise (``time.time()`` stamped into the message) to the parent catching it.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import math
import os
import platform
import re
import signal
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone

import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp
from torch.multiprocessing.spawn import ProcessRaisedException

import nb_accel

WORLD_SIZE = 2
NB_NAME = "nb_accel.notebook_launcher"
FLOOR_NAME = "floor: torch start_processes"
FLOOR_RATIO_TARGET = 1.2  # nb_accel median / floor median
ACCELERATE_SPEEDUP_TARGET = 2.0  # Accelerate median / nb_accel median
FAILURE_TARGET_S = 0.5  # "well under a second"
RAISED_AT = "BENCH_RAISED_AT="
ELASTIC_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)

#: A launch for one round: gets a fresh free port (ignored by launchers that need none).
Launch = Callable[[int], object]


@dataclass(frozen=True)
class Contender:
    """One row of a table: a name and how to launch once."""

    name: str
    launch: Launch


# --- Worker functions (module level, so every launcher can pickle them) ----------------------


def nb_barrier() -> None:
    """nb_accel worker: the process group is already up, so just meet the other rank."""
    dist.barrier()


def floor_barrier(rank: int, port: int) -> None:
    """Floor worker: join a gloo group over TCP, barrier, leave."""
    _init_tcp(rank, port)
    dist.barrier()
    dist.destroy_process_group()


def accelerate_barrier() -> None:
    """Accelerate worker: join the group unless the launcher did (debug_launcher), barrier."""
    if dist.is_initialized():
        dist.barrier()  # the launcher owns this group, as with nb_accel
        return
    dist.init_process_group("gloo")  # env:// from torchelastic's MASTER_ADDR/PORT, RANK, ...
    dist.barrier()
    dist.destroy_process_group()


def accelerate_probe(directory: str) -> None:
    """Accelerate worker for the probe: join the group and leave a file named after the pid."""
    accelerate_barrier()
    with open(os.path.join(directory, str(os.getpid())), "w"):
        pass


def nb_fail(sleep_s: float) -> None:
    """nb_accel worker: rank 1 raises at once, rank 0 sleeps."""
    _fail_or_sleep(dist.get_rank(), sleep_s)


def floor_fail(rank: int, port: int, sleep_s: float) -> None:
    """Floor worker: join the group, then rank 1 raises at once and rank 0 sleeps."""
    _init_tcp(rank, port)
    _fail_or_sleep(rank, sleep_s)


def _init_tcp(rank: int, port: int) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE
    )


def _fail_or_sleep(rank: int, sleep_s: float) -> None:
    if rank == 1:
        raise RuntimeError(f"{RAISED_AT}{time.time():.6f}")
    time.sleep(sleep_s)


# --- Helpers --------------------------------------------------------------------------------


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Send fds 1 and 2 (and so forked workers' output) to a temp file; show it on error."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = (os.dup(1), os.dup(2))
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 1)
        os.dup2(capture.fileno(), 2)
        failed = True
        try:
            yield
            failed = False
        finally:
            _restore_fds(saved)
            if failed:
                capture.seek(0)
                sys.stderr.write(capture.read()[-4000:].decode(errors="replace"))


def _restore_fds(saved: tuple[int, int]) -> None:
    """Point fds 1 and 2 back at ``saved`` and close the copies."""
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, copy in zip((1, 2), saved, strict=True):
        os.dup2(copy, fd)
        os.close(copy)


@contextlib.contextmanager
def kept_signal_handlers() -> Iterator[None]:
    """Undo the SIGTERM/SIGINT/... handlers torchelastic leaves in the calling process.

    Without this, nb_accel's forked workers would inherit them after an Accelerate round.
    """
    saved = {signum: signal.getsignal(signum) for signum in ELASTIC_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def p90(samples: list[float]) -> float:
    """90th percentile, nearest rank."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


# --- Contenders -----------------------------------------------------------------------------


def launch_nb_accel(port: int) -> object:
    """``nb_accel.notebook_launcher`` with its defaults (fork on Linux); needs no port."""
    del port
    return nb_accel.notebook_launcher(nb_barrier, num_processes=WORLD_SIZE)


def launch_floor(port: int) -> object:
    """Launch the floor: plain ``torch.multiprocessing.start_processes`` with fork."""
    return torch_mp.start_processes(
        floor_barrier, args=(port,), nprocs=WORLD_SIZE, start_method="fork", join=True
    )


def accelerate_contender() -> Contender | str:
    """Accelerate's launcher as a contender, or why there is none."""
    try:
        import accelerate
    except ImportError:
        return "accelerate is not installed (`make bench` installs it); its row is skipped"
    version = accelerate.__version__
    notebook = _accelerate_launch(accelerate.notebook_launcher)
    if _runs_on_workers(notebook):
        return Contender(f"accelerate {version} notebook_launcher", notebook)
    debug = _accelerate_launch(accelerate.debug_launcher)
    if _runs_on_workers(debug):
        return Contender(f"accelerate {version} debug_launcher (CPU)", debug)
    return f"accelerate {version}: neither launcher ran {WORLD_SIZE} worker processes; skipped"


def _accelerate_launch(launcher: Callable[..., object]) -> Callable[..., object]:
    """Wrap an Accelerate launcher: fresh port per call when it takes one, handlers restored."""
    takes_port = "use_port" in inspect.signature(launcher).parameters

    def launch(
        port: int, function: Callable[..., None] = accelerate_barrier, args: tuple[object, ...] = ()
    ) -> object:
        options: dict[str, object] = {"num_processes": WORLD_SIZE}
        if takes_port:
            options["use_port"] = str(port)
        with kept_signal_handlers():
            return launcher(function, args, **options)

    return launch


def _runs_on_workers(launch: Callable[..., object]) -> bool:
    """Whether ``launch`` runs the function on WORLD_SIZE processes other than this one."""
    with tempfile.TemporaryDirectory() as directory:
        try:
            with quiet():
                launch(free_port(), accelerate_probe, (directory,))
        except Exception as exc:  # noqa: BLE001 - a refusal just means "try the next launcher"
            print(f"  (probe: {type(exc).__name__}: {exc})", file=sys.stderr)
            return False
        pids = set(os.listdir(directory))
    return len(pids) == WORLD_SIZE and str(os.getpid()) not in pids


# --- Benchmarks -----------------------------------------------------------------------------


def time_launches(contenders: list[Contender], rounds: int, warmup: int) -> dict[str, list[float]]:
    """Seconds per launch for each contender; the order flips every round."""
    samples: dict[str, list[float]] = {c.name: [] for c in contenders}
    for index in range(warmup + rounds):
        order = contenders if index % 2 == 0 else contenders[::-1]
        for contender in order:
            port = free_port()
            with quiet():
                start = time.perf_counter()
                contender.launch(port)
                elapsed = time.perf_counter() - start
            if index >= warmup:
                samples[contender.name].append(elapsed)
    return samples


def failure_delay(launch: Callable[[int], object], catches: type[BaseException]) -> float:
    """Seconds from a worker's raise to the parent catching ``catches``."""
    port = free_port()
    with quiet():
        try:
            launch(port)
        except catches as exc:
            caught = time.time()
            message = str(exc)
        else:
            raise AssertionError("the failing launch returned normally")
    found = re.search(re.escape(RAISED_AT) + r"([0-9.]+)", message)
    if found is None:
        raise AssertionError(f"no raise time in the exception: {message[:300]!r}")
    return caught - float(found.group(1))


def time_failures(rounds: int, sleep_s: float) -> dict[str, list[float]]:
    """Failure latency of nb_accel and of the floor, alternating."""

    def nb(port: int) -> object:
        del port
        return nb_accel.notebook_launcher(nb_fail, args=(sleep_s,), num_processes=WORLD_SIZE)

    def floor(port: int) -> object:
        return torch_mp.start_processes(
            floor_fail, args=(port, sleep_s), nprocs=WORLD_SIZE, start_method="fork", join=True
        )

    runs = [(NB_NAME, nb, RuntimeError), (FLOOR_NAME, floor, ProcessRaisedException)]
    samples: dict[str, list[float]] = {name: [] for name, _, _ in runs}
    for index in range(rounds):
        for name, launch, catches in runs if index % 2 == 0 else runs[::-1]:
            samples[name].append(failure_delay(launch, catches))
    return samples


# --- Report ---------------------------------------------------------------------------------


def print_header(args: argparse.Namespace) -> None:
    """Date, machine and versions, so a pasted table says where it came from."""
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    gpu = "CUDA GPU" if torch.cuda.is_available() else "no GPU"
    print(
        f"{stamp}; {os.cpu_count()} CPU cores, {gpu}; Python {platform.python_version()}, "
        f"torch {torch.__version__}, nb_accel {nb_accel.__version__}"
    )
    sizes = ", ".join(str(size) for size in args.processes)
    print(
        f"{sizes} processes, fork, gloo; {args.rounds} rounds after {args.warmup} "
        f"warm-up rounds, contenders alternating\n"
    )


def print_launch_table(samples: dict[str, list[float]], floor_name: str) -> None:
    """Median, p90 and ratio to the floor's median for every contender."""
    floor_median = statistics.median(samples[floor_name])
    width = max(len(name) for name in samples)
    print(f"Launch + teardown, barrier on {WORLD_SIZE} ranks")
    print(f"{'contender':<{width}}  {'median s':>8}  {'p90 s':>7}  {'vs floor':>8}")
    for name, values in samples.items():
        median = statistics.median(values)
        print(f"{name:<{width}}  {median:8.3f}  {p90(values):7.3f}  {median / floor_median:7.2f}x")


def print_launch_targets(samples: dict[str, list[float]], floor: str, accel: str | None) -> None:
    """Pass/fail lines for the two launch targets."""
    nb = statistics.median(samples[NB_NAME])
    ratio = nb / statistics.median(samples[floor])
    verdict = "PASS" if ratio <= FLOOR_RATIO_TARGET else "FAIL"
    print(f"target nb_accel <= {FLOOR_RATIO_TARGET}x floor: {ratio:.2f}x  {verdict}")
    if accel is None:
        print(
            f"target nb_accel >= {ACCELERATE_SPEEDUP_TARGET}x faster than Accelerate: not measured"
        )
        return
    speedup = statistics.median(samples[accel]) / nb
    verdict = "PASS" if speedup >= ACCELERATE_SPEEDUP_TARGET else "FAIL"
    print(
        f"target nb_accel >= {ACCELERATE_SPEEDUP_TARGET}x faster than Accelerate: "
        f"{speedup:.2f}x  {verdict}"
    )


def print_failure_table(samples: dict[str, list[float]], sleep_s: float) -> None:
    """Median, p90 and max failure latency, and the nb_accel target."""
    rounds = len(next(iter(samples.values())))
    width = max(len(name) for name in samples)
    print(
        f"\nWorker exception -> raised in the parent (rank 1 raises, rank 0 sleeps "
        f"{sleep_s:g} s; {rounds} rounds)"
    )
    print(f"{'launcher':<{width}}  {'median s':>8}  {'p90 s':>7}  {'max s':>7}")
    for name, values in samples.items():
        print(
            f"{name:<{width}}  {statistics.median(values):8.3f}  {p90(values):7.3f}  "
            f"{max(values):7.3f}"
        )
    nb = statistics.median(samples[NB_NAME])
    verdict = "PASS" if nb < FAILURE_TARGET_S else "FAIL"
    print(f"target nb_accel < {FAILURE_TARGET_S} s: {nb:.3f} s  {verdict}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="timed launch rounds")
    parser.add_argument("--warmup", type=int, default=2, help="untimed launch rounds first")
    parser.add_argument("--failure-rounds", type=int, default=10, help="failure-latency rounds")
    parser.add_argument(
        "--sleep", type=float, default=5.0, help="seconds rank 0 sleeps while rank 1 fails"
    )
    parser.add_argument("--no-accelerate", action="store_true", help="skip Accelerate")
    parser.add_argument(
        "--processes",
        type=int,
        nargs="+",
        default=[2],
        help="ranks per launch: a launch table for each (the failure table runs with 2)",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.warmup < 0 or args.failure_rounds < 0:
        parser.error("--rounds must be >= 1, --warmup and --failure-rounds >= 0")
    if any(size < 2 for size in args.processes):
        parser.error("--processes must be 2 or more")
    return args


def main(argv: list[str] | None = None) -> None:
    """Run both benchmarks and print their tables."""
    global WORLD_SIZE  # noqa: PLW0603 - the forked ranks read the launch's size here
    args = parse_args(argv)
    print_header(args)
    for size in args.processes:
        WORLD_SIZE = size
        contenders = [Contender(FLOOR_NAME, launch_floor), Contender(NB_NAME, launch_nb_accel)]
        accel = accelerate_contender() if not args.no_accelerate else "Accelerate: skipped"
        if isinstance(accel, Contender):
            contenders.append(accel)
        else:
            print(f"{accel}\n")
        samples = time_launches(contenders, args.rounds, args.warmup)
        print_launch_table(samples, FLOOR_NAME)
        accel_name = accel.name if isinstance(accel, Contender) else None
        print_launch_targets(samples, FLOOR_NAME, accel_name)
        print()
    WORLD_SIZE = 2
    if args.failure_rounds:
        print_failure_table(time_failures(args.failure_rounds, args.sleep), args.sleep)


if __name__ == "__main__":
    main()
