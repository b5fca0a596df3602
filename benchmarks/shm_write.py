"""A big tensor's first send, against the floor: writing it into ``/dev/shm``.

Run from the repository root::

    .venv/bin/python benchmarks/shm_write.py --gb 4 --rounds 4

The first time a kernel tensor reaches warm workers, its bytes are written once into a
shared-memory segment (``write_segment``, the same call a warm launch makes), which the
workers then map. This times that write against its floor, one bare ``pwrite`` of the same
bytes into a new file in ``/dev/shm``, alternating the two (each file removed before the next
write), so that whatever the machine does with the memory freed in between falls on both.
Each write's time is printed in order, then each contender's median and spread.
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import tempfile
import time
from collections.abc import Callable

import torch
from machine import run_header

import nb_accel
from nb_accel.worker.transfer.segments import SHM_ROOT, remove_segment, write_segment


def bare_write(tensor: torch.Tensor) -> float:
    """Seconds of one bare ``pwrite`` of ``tensor``'s bytes into a new ``/dev/shm`` file."""
    view = memoryview(tensor.numpy()).cast("B")
    fd, path = tempfile.mkstemp(dir=SHM_ROOT)
    try:
        start = time.perf_counter()
        written = 0
        while written < len(view):  # one write moves at most about 2 GB
            written += os.pwrite(fd, view[written:], written)
        return time.perf_counter() - start
    finally:
        os.close(fd)
        os.unlink(path)


def segment_write(tensor: torch.Tensor) -> float:
    """Seconds of ``write_segment`` of ``tensor``'s bytes, as a warm launch sends them."""
    folder = tempfile.mkdtemp(dir=SHM_ROOT)
    try:
        start = time.perf_counter()
        written = write_segment(folder, [pickle.PickleBuffer(tensor.numpy())])
        seconds = time.perf_counter() - start
        if written is None:
            raise RuntimeError(f"no room in {SHM_ROOT} for {tensor.nbytes >> 20} MB")
        remove_segment(written[0])
        return seconds
    finally:
        os.rmdir(folder)


def main() -> None:
    """Alternate the two writes and print their times."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=4)
    options = parser.parse_args()
    print(run_header(nb_accel=nb_accel.__version__))
    tensor = torch.ones(int(options.gb * 2**30) // 4)
    bare_write(tensor)  # untimed: the machine's first touch of that much memory
    contenders: dict[str, Callable[[torch.Tensor], float]] = {
        "floor: one bare pwrite": bare_write,
        "write_segment (a warm launch's send)": segment_write,
    }
    times: dict[str, list[float]] = {name: [] for name in contenders}
    print(f"\n{options.gb:g} GB, {options.rounds} rounds, each write in the order made (s):")
    for index in range(options.rounds):
        order = list(contenders) if index % 2 == 0 else list(contenders)[::-1]
        for name in order:
            seconds = contenders[name](tensor)
            times[name].append(seconds)
            print(f"  {name:<38} {seconds:6.3f}")
    print(f"\n{'contender':<38} {'median s':>8}  lowest-highest")
    for name, values in times.items():
        print(f"{name:<38} {statistics.median(values):8.3f}  {min(values):.3f}-{max(values):.3f}")
    ratio = statistics.median(times["write_segment (a warm launch's send)"]) / statistics.median(
        times["floor: one bare pwrite"]
    )
    print(f"write_segment / floor, medians: {ratio:.2f}x")


if __name__ == "__main__":
    main()
