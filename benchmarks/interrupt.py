"""Interrupt benchmark: from SIGINT to KeyboardInterrupt in the caller with every worker gone.

Run from the repository root: ``.venv/bin/python benchmarks/interrupt.py`` (also part of
``make bench``). The baseline, measured in the same run, is the bare cost of killing and reaping
two forked sleeping processes (SIGKILL + wait), which no launcher can beat.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import multiprocessing
import os
import signal
import statistics
import threading
import time

import psutil

import nb_accel

TARGET_S = 2.0


def sleeper() -> None:
    """Announce readiness and sleep: a launch that only an interrupt ends."""
    print("ready", flush=True)
    time.sleep(600)


def interrupt_nb_accel(delay_s: float) -> float:
    """Seconds from SIGINT to KeyboardInterrupt raised with no child process left."""
    sent: list[float] = []

    def fire() -> None:
        sent.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Timer(delay_s, fire)
    timer.start()
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            nb_accel.notebook_launcher(sleeper, num_processes=2)
    except KeyboardInterrupt:
        done = time.perf_counter()
    else:
        raise AssertionError("the launch ended without the interrupt")
    finally:
        timer.join()
    if psutil.Process().children(recursive=True):
        raise AssertionError("workers left behind after the interrupt")
    return done - sent[0]


def kill_floor(delay_s: float) -> float:
    """Seconds to SIGKILL and reap two forked sleeping processes."""
    context = multiprocessing.get_context("fork")
    processes = [context.Process(target=time.sleep, args=(600,)) for _ in range(2)]
    for process in processes:
        process.start()
    time.sleep(delay_s)
    start = time.perf_counter()
    for process in processes:
        process.kill()
    for process in processes:
        process.join()
    return time.perf_counter() - start


def main() -> None:
    """Alternate both measurements and print medians and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--delay", type=float, default=0.5, help="seconds before the interrupt")
    args = parser.parse_args()
    nb: list[float] = []
    floor: list[float] = []
    for _ in range(args.rounds):
        nb.append(interrupt_nb_accel(args.delay))
        floor.append(kill_floor(args.delay))
    nb_median, floor_median = statistics.median(nb), statistics.median(floor)
    print(f"\nInterrupt during a 2-process launch ({args.rounds} rounds)")
    print(f"{'contender':<38}  {'median s':>8}  {'max s':>7}")
    print(f"{'floor: SIGKILL + reap 2 processes':<38}  {floor_median:8.4f}  {max(floor):7.4f}")
    print(f"{'nb_accel: SIGINT -> KeyboardInterrupt':<38}  {nb_median:8.4f}  {max(nb):7.4f}")
    print(f"ratio vs floor: {nb_median / floor_median:.1f}x")
    verdict = "PASS" if max(nb) < TARGET_S else "FAIL"
    print(f"target: every worker stopped within {TARGET_S:g} s: max {max(nb):.3f} s  {verdict}")


if __name__ == "__main__":
    main()
